"""Declarative folds run inside the database: :mod:`.base` (what every backend shares: the
folded range, its merge into states), :mod:`.sqlite` (one grouped statement per range) and
:mod:`.postgres` (ranges read into Arrow), and :func:`build`, which picks one for a processor.

``ENABLED = False`` (or ``app.aggregation(..., pushdown=False)``) turns the pushdown off: every
range then takes the row path.
"""

from __future__ import annotations

import importlib.util

from ....store import EventStore
from ....store.postgres import PostgresEventStore
from ....store.sqlite import SQLiteEventStore
from ....upcasting import Upcasters
from ..declarative import INT64, Declaration
from .base import Pushdown
from .postgres import PostgresPushdown
from .sqlite import SQLitePushdown

__all__ = ["ENABLED", "build"]

#: the pushdown is tried at all (tests turn it off to compare with the row path)
ENABLED = True


def build(
    decl: Declaration | None,
    stores: list[EventStore],
    enabled: bool,
    upcasters: Upcasters | None = None,
) -> Pushdown | None:
    """The pushdown of ``decl`` when it can run at all (else None: the row path);
    ``upcasters``: the processor's (old types are read by rows, or upcast in Arrow)."""
    if not (ENABLED and enabled) or decl is None or len(stores) != 1:
        return None
    upcasters = upcasters.into(decl.types) if upcasters is not None else None
    store = stores[0]
    if not isinstance(store, PostgresEventStore | SQLiteEventStore):
        return None
    if float in decl.columns.values():
        return None
    for op in decl.fields.values():
        for _, value in op.where:
            if type(value) is int and not INT64[0] <= value <= INT64[1]:
                return None
            if type(value) is str and (not _encodes(value) or "\x00" in value):
                return None
    if isinstance(store, SQLiteEventStore):
        return SQLitePushdown(decl, store, upcasters)
    if not all(importlib.util.find_spec(m) for m in ("pyarrow", "adbc_driver_postgresql")):
        return None  # without the arrow extra: the row path
    return PostgresPushdown(decl, store, upcasters)


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
