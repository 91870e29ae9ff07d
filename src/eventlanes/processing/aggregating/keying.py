"""Which events an aggregation folds, and the key of each: one place, so the local engine and
a Spark replay (which ships this object to executors: it holds functions and names only, no
App) pick and key the same events the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...events import Event, datas, types
from ...policies import state_key
from ..handlers import FunctionsByType
from .declarative import Declaration

if TYPE_CHECKING:
    from .aggregation import Aggregation


def of_types(events: list[Event], wanted: frozenset[str]) -> list[Event]:
    """The events of the ``wanted`` types (all of them, usually: reads filter by type)."""
    if len(wanted) == 1:
        (only,) = wanted
        if types(events).count(only) == len(events):
            return events
    return [e for e in events if e.type in wanted]


@dataclass(frozen=True)
class Keying:
    name: str
    folds: FunctionsByType
    key: Callable[[Event], Any]
    key_field: str | None
    declaration: Declaration | None

    @classmethod
    def of(cls, agg: Aggregation) -> Keying:
        return cls(agg.name, agg.folds, agg.key, agg.key_field, agg.declaration)

    def keyed(self, events: list[Event]) -> tuple[list[Event], list[str], Any]:
        """The events folded, their keys (each computed once) and, for a declared
        aggregation, their decoded data."""
        decl = self.declaration
        if decl is not None:
            mine = of_types(events, decl.types)
            rows = datas(mine, keep=False)  # read by the declaration only: not kept
            return mine, decl.keys_of(mine, rows), rows
        handles, key = self.folds.handles, self.key
        handled = self.folds.types()
        if handled is not None and not self.folds.any:
            mine = of_types(events, handled)
        else:
            mine = [e for e in events if handles(e.type)]
        field = self.key_field
        if field is not None:  # key="k": from the data, decoded in one pass
            keys: list[Any] = [d.get(field) for d in datas(mine)]
            if list(map(type, keys)).count(str) == len(keys):
                return mine, keys, None
        what = f"aggregation {self.name!r}"
        keys = [k if (k := key(e)).__class__ is str else state_key(k, what, e) for e in mine]
        return mine, keys, None
