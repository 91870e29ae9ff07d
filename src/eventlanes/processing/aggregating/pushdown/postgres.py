"""The pushdown (:mod:`.base`) on PostgreSQL: a declarative aggregation's ranges read
straight into Arrow (binary COPY, ``scan_arrow``) and folded there
(:mod:`eventlanes.columnar.fold`, pyarrow's hash aggregates), instead of an
:class:`~eventlanes.events.Event` per row; returned as the groups the SQLite statement
returns and merged the same way. It needs the ``arrow`` extra (pyarrow and the ADBC
drivers); without it, ranges take the row path.

The reference is the row path, which reads the same ``data::text`` and decodes it in Python.
A range is folded in Arrow only when that is exact (see :func:`.fold.groups`); otherwise (and
when reading or parsing fails) it takes the row path, which raises the errors naming the
event. Ranges end at the store's visibility horizon, as row reads do: a token moved to a
range's end passes no event that a concurrent writer may still commit.

Events of an old type that an upcaster turns into a folded one (:mod:`eventlanes.upcasting`)
are read with the range, and only those rows are upcast in Python (the user's functions) before
the columns are folded: the fold sees current shapes only. A batch without them is folded as it
was read; an upcaster that fails sends the range to the row path, which parks or retries the
event's key with the error.
"""

from __future__ import annotations

from typing import Any

from ....store.postgres import PostgresEventStore
from ....upcasting import Upcasters
from ....upcasting.arrow import upcast_batch
from ..declarative import Declaration
from .base import Pushdown


class PostgresPushdown(Pushdown):
    """One declaration folded over a PostgreSQL store's ranges in Arrow (every range: old
    shapes are upcast in the batches, not left to the row path)."""

    store: PostgresEventStore

    def __init__(
        self, decl: Declaration, store: PostgresEventStore, upcasters: Upcasters | None = None
    ) -> None:
        super().__init__(decl, store, upcasters)
        self.kinds = decl.kinds()
        self.spec = list(decl.partials())
        self.types = sorted(upcasters.reads(decl.types) or () if upcasters else decl.types)

    def _range(self, after: int, span: int) -> tuple[list[list[Any]] | None, int]:
        import pyarrow as pa

        from ....columnar.fold import groups

        upto = max(after, min(self.store.horizon(), after + span))
        if upto == after:
            return [], upto
        columns: list[str] | None = ["position", "data", "metadata"]
        if self.upcasters is not None:
            columns = None  # an upcaster is given the whole event
        batches = list(self.store.scan_arrow(after, upto, types=self.types, columns=columns))
        if not batches:
            return [], upto
        if self.upcasters is not None:  # UpcastError: the range takes the row path
            batches = [upcast_batch(self.upcasters, b) for b in batches]
        table = pa.Table.from_batches(batches)
        return groups(table, self.decl.key, self.kinds, self.spec), upto
