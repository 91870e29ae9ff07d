"""Declarative aggregations: counts, sums, minimum, maximum, first and last values of data
properties per key, run without calling Python per event.

``el.count()``, ``el.sum("n")``, ``el.min("t", float)`` ... declare what a state holds; the
declaration runs four ways, with one meaning:

* :meth:`Declaration.fold` -- one event at a time (the reference; Spark's continuous mode and
  downstream paths use it);
* :meth:`Declaration.fold_batch` -- the local engine, column by column over a segment's batch
  (the reference for the next one);
* :mod:`.pushdown` -- the local engine over a SQLite store: ranges folded inside SQLite, one
  grouped statement each, where that provably equals ``fold_batch`` (else ``fold_batch``); over
  PostgreSQL, ranges read into Arrow and aggregated there (:mod:`.pushdown.postgres`);
* ``eventlanes.spark.declarative`` -- Spark column expressions (``from_json``, window and
  ``groupBy`` aggregates), no Python on the executors.

Types are strict on every engine, as Spark's ``from_json`` in FAILFAST mode is: an ``int`` field
holding ``1.5``, ``"3"`` or ``true`` fails the batch with an error naming the event, the field
and the value; ``null`` or a missing property is skipped by every operation (``count()`` without
a field counts events). ``str`` fields take a value as JSON text renders it (strings as they
are); a key must be a string (``policies.state_key``). Sums are of 64-bit integers (Spark
fails on overflow; floating-point sums depend on the order of additions, so they are left to
Python folds).

The state is a JSON object ``{name: value}``: counts and sums start at 0, the others at null.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ...columnar.fold import Field as ColumnarField
from ...errors import FieldTypeError, InvalidInputError
from ...events import Event, datas
from ...policies import state_key
from ..tables.states import Entry
from .dedupe import Marks, dedupe

__all__ = ["Declaration", "Op", "count", "first", "last", "max", "min", "sum"]

#: data property names usable in a declaration (also safe in a Spark JSON path)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TYPES: dict[type, str] = {int: "long", float: "double", str: "string", bool: "boolean"}
KINDS = ("count", "sum", "min", "max", "first", "last")
#: the integers a declared ``int`` holds (64-bit, as Spark's ``long``)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Op:
    """One state field: ``kind`` of data property ``field`` (typed ``type``), over the events
    whose data match ``where`` (property -> JSON value, all equal)."""

    kind: str
    field: str | None
    type: type
    where: tuple[tuple[str, Any], ...] = ()

    @property
    def initial(self) -> Any:
        return 0 if self.kind in ("count", "sum") else None


def _where(where: Mapping[str, Any] | None, what: str) -> tuple[tuple[str, Any], ...]:
    if where is None:
        return ()
    if not isinstance(where, Mapping) or not where:
        raise InvalidInputError(f"{what}: where must be a non-empty dict of property -> value")
    out = []
    for name, value in where.items():
        _check_name(name, f"{what} where")
        if type(value) not in TYPES:
            raise InvalidInputError(
                f"{what}: where[{name!r}] must be a str, int, float or bool, got {value!r}"
            )
        out.append((name, value))
    return tuple(out)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidInputError(
            f"{what}: a data property name must be a string of letters, digits and _ "
            f"(not starting with a digit), got {name!r}"
        )
    return name


def _op(kind: str, name: Any, type_: Any, where: Any, allowed: tuple[type, ...]) -> Op:
    what = f"el.{kind}({name!r})"
    _check_name(name, what)
    if type_ not in allowed:
        names = ", ".join(t.__name__ for t in allowed)
        raise InvalidInputError(f"{what}: type must be one of {names}, got {type_!r}")
    return Op(kind, name, type_, _where(where, what))


def count(field: str | None = None, *, where: Mapping[str, Any] | None = None) -> Op:
    """Events folded (that match ``where``); with ``field``: those where it is not null."""
    if field is None:
        return Op("count", None, int, _where(where, "el.count()"))
    return _op("count", field, int, where, (int,))


def sum(field: str, type: Any = int, *, where: Mapping[str, Any] | None = None) -> Op:  # noqa: A001
    """The sum of an integer property (64-bit)."""
    if type is float:
        raise InvalidInputError(
            f"el.sum({field!r}, float): a sum of floats depends on the order of additions, "
            "which engines do not share: use a Python fold (or integer units)"
        )
    return _op("sum", field, type, where, (int,))


def min(field: str, type: Any = int, *, where: Mapping[str, Any] | None = None) -> Op:  # noqa: A001
    """The smallest value of a data property (``int``, ``float`` or ``str``) among the folded events
    that have it."""
    return _op("min", field, type, where, (int, float, str))


def max(field: str, type: Any = int, *, where: Mapping[str, Any] | None = None) -> Op:  # noqa: A001
    """The largest value of a data property (``int``, ``float`` or ``str``) among the folded events
    that have it."""
    return _op("max", field, type, where, (int, float, str))


def first(field: str, type: Any = str, *, where: Mapping[str, Any] | None = None) -> Op:
    """The value of the earliest folded event that has the property (not null)."""
    return _op("first", field, type, where, (int, float, str, bool))


def last(field: str, type: Any = str, *, where: Mapping[str, Any] | None = None) -> Op:
    """The value of the latest folded event that has the property (not null)."""
    return _op("last", field, type, where, (int, float, str, bool))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def convert(value: Any, type_: type, name: str, event: Event) -> Any:
    """``value`` as the declared ``type_`` (None stays None), or FieldTypeError."""
    if value is None:
        return None
    cls = value.__class__
    if type_ is str:
        return value if cls is str else json.dumps(value)
    if type_ is int:
        if cls is int and INT64[0] <= value <= INT64[1]:
            return value
    elif type_ is float:
        if cls is float or cls is int:
            return float(value)
    elif cls is bool:
        return value
    raise FieldTypeError(
        f"event {event.position} ({event.type}): data property {name!r} is {value!r}, "
        f"declared {type_.__name__}" + (" (64-bit)" if type_ is int and cls is int else "")
    )


@dataclass
class Declaration:
    """``key`` (a data property), the event ``types`` folded, and the state's ``fields``."""

    name: str
    key: str
    types: frozenset[str]
    fields: dict[str, Op]
    #: every data property read, with its one type (a property may not have two)
    columns: dict[str, type] = field(default_factory=dict)

    @classmethod
    def build(cls, name: str, key: Any, on: Any, fields: Any) -> Declaration:
        what = f"aggregation {name!r}"
        if not isinstance(key, str) or not NAME.fullmatch(key):
            raise InvalidInputError(
                f"{what}: a declarative aggregation's key must be a data property name "
                f"(letters, digits, _), got {key!r}"
            )
        types = [on] if isinstance(on, str) else on
        if (
            not isinstance(types, Iterable)
            or not (types := list(types))
            or not builtins.all(isinstance(t, str) and t for t in types)
        ):
            raise InvalidInputError(f"{what}: on= must name the event type(s) folded, got {on!r}")
        if not isinstance(fields, Mapping) or not fields:
            raise InvalidInputError(
                f"{what}: fields must be a non-empty dict of name -> el.count(), el.sum(), ..."
            )
        ops: dict[str, Op] = {}
        columns: dict[str, type] = {key: str}
        for out, op in fields.items():
            if not isinstance(out, str) or not out:
                raise InvalidInputError(f"{what}: state field names must be strings, got {out!r}")
            if not isinstance(op, Op):
                raise InvalidInputError(
                    f"{what}: field {out!r} must be el.count(), el.sum(), el.min(), el.max(), "
                    f"el.first() or el.last(), got {op!r}"
                )
            ops[out] = op
            used = [(op.field, op.type)] if op.field else []
            used += [(n, type(v)) for n, v in op.where]
            for prop, type_ in used:
                if columns.setdefault(prop, type_) is not type_:
                    raise InvalidInputError(
                        f"{what}: data property {prop!r} is used as {columns[prop].__name__} "
                        f"and as {type_.__name__}"
                    )
        return cls(name, key, frozenset(types), ops, columns)

    def initial(self) -> dict[str, Any]:
        return self.fresh.copy()  # each field's initial is a number or None: a copy is fresh

    @cached_property
    def fresh(self) -> dict[str, Any]:
        return {out: op.initial for out, op in self.fields.items()}

    def kinds(self) -> dict[str, str]:
        """Every data property read -> its Spark type name (what the Arrow reads type)."""
        return {p: TYPES[t] for p, t in self.columns.items()}

    def partials(self) -> tuple[ColumnarField, ...]:
        """Per state field ``(kind, data property or None, where)``: what the Arrow folds
        (:mod:`eventlanes.columnar.fold`) compute of it."""
        return tuple((op.kind, op.field, op.where) for op in self.fields.values())

    def merge(self, into: dict[str, Any], other: dict[str, Any]) -> None:
        """``other``'s fields merged into ``into`` (two session windows an input bridged):
        counts and sums added, the least or greatest kept (first and last are refused with
        session windows: which input came first is not kept)."""
        for out, op in self.fields.items():
            a, b = into[out], other[out]
            if op.kind in ("count", "sum"):
                into[out] = a + b
            elif op.kind in ("min", "max"):
                if b is not None and (a is None or (b < a if op.kind == "min" else b > a)):
                    into[out] = b
            else:
                raise AssertionError(f"el.{op.kind}() has no merge")

    def key_of(self, event: Event) -> str:
        return self._key(event.data, event)

    def _key(self, data: dict[str, Any], event: Event) -> str:
        value = data.get(self.key)
        if value is None:
            raise InvalidInputError(
                f"event {event.position} ({event.type}): no key property {self.key!r} "
                f"for aggregation {self.name!r}"
            )
        return state_key(value, f"aggregation {self.name!r}", event)

    # -- one event at a time (the reference) ---------------------------------------------------
    def fold(self, state: dict[str, Any], event: Event) -> None:
        data = event.data
        values = {p: convert(data.get(p), t, p, event) for p, t in self.columns.items()}
        for out, op in self.fields.items():
            if op.where and not builtins.all(values[n] == v for n, v in op.where):
                continue
            if op.field is None:
                state[out] += 1
                continue
            v = values[op.field]
            if v is None:
                continue
            cur = state[out]
            kind = op.kind
            if kind == "count":
                state[out] = cur + 1
            elif kind == "sum":
                state[out] = cur + v
            elif kind == "min":
                if cur is None or v < cur:
                    state[out] = v
            elif kind == "max":
                if cur is None or v > cur:
                    state[out] = v
            elif kind == "first":
                if cur is None:
                    state[out] = v
            else:  # last
                state[out] = v

    # -- a batch, column by column (the local engine) ------------------------------------------
    def keys(self, events: list[Event]) -> list[str]:
        """The key of each event (its data decoded once, kept in the event)."""
        return self.keys_of(events, datas(events))

    def keys_of(self, events: list[Event], rows: list[dict[str, Any]]) -> list[str]:
        """The key of each event, from its decoded data ``rows``."""
        kf = self.key
        keys: list[Any] = [d.get(kf) for d in rows]
        if list(map(type, keys)).count(str) != len(keys):
            # not a string: refused (policies.state_key), missing: an error naming the event
            for i, k in enumerate(keys):
                if k.__class__ is not str:
                    keys[i] = self._key(rows[i], events[i])
        return keys

    def fold_batch(
        self,
        events: list[Event],
        keys: list[str],
        entries: dict[str, Entry],
        source: str,
        marks: Marks | None = None,
        rows: list[dict[str, Any]] | None = None,
    ) -> int:
        """Fold ``events`` (of this aggregation's types, in position order, keyed ``keys``) into
        ``entries`` (every key present). Returns how many were folded (not dropped).
        ``marks``: the worker's (see :func:`~.chains.dedupe`); ``rows``: the events' data if
        already decoded."""
        n = len(events)
        if rows is None:
            rows = datas(events)
        accepted = dedupe(events, keys, entries, source, marks)
        if len(accepted) != n:
            events = [events[i] for i in accepted]
            rows = [rows[i] for i in accepted]
            keys = [keys[i] for i in accepted]
        if events:
            self.fold_into(events, rows, keys, [entries[k].value for k in keys])
        return len(accepted)

    def fold_into(
        self,
        events: list[Event],
        rows: list[dict[str, Any]],
        keys: list[str],
        states: list[dict[str, Any]],
    ) -> None:
        """Fold each of ``events`` (data ``rows``, keyed ``keys``) into the state beside it in
        ``states`` (one state may stand beside several: they fold in order), a column at a
        time: a windowed aggregation's inputs into their windows."""
        kf = self.key
        columns = {p: self._column(p, t, rows, events) for p, t in self.columns.items() if p != kf}
        columns[kf] = keys
        for out, op in self.fields.items():
            chosen = states
            col: list[Any] | None = columns[op.field] if op.field is not None else None
            if op.where:
                tests = [(columns[p], v) for p, v in op.where]
                picked = [
                    i for i in range(len(states)) if builtins.all(c[i] == v for c, v in tests)
                ]
                chosen = [states[i] for i in picked]
                if col is not None:
                    col = [col[i] for i in picked]
            if col is None:  # count() of events
                _count(out, chosen)
                continue
            if col.count(None):  # null or missing: skipped by every operation
                kept = [i for i, v in enumerate(col) if v is not None]
                chosen = [chosen[i] for i in kept]
                col = [col[i] for i in kept]
            _APPLY[op.kind](out, chosen, col)

    def _column(
        self, prop: str, type_: type, rows: list[dict[str, Any]], events: list[Event]
    ) -> list[Any]:
        """One property of every event, checked for its type at C speed on the usual path."""
        col = [d.get(prop) for d in rows]
        kinds = set(map(type, col))
        kinds.discard(type(None))
        if not kinds:
            return col
        if kinds == {type_} and type_ is not float:  # float columns may hold ints: converted
            if type_ is not int:
                return col
            ints: list[int] = [v for v in col if v is not None]
            if INT64[0] <= builtins.min(ints) and builtins.max(ints) <= INT64[1]:
                return col
        elif kinds == {float} and type_ is float:
            return col
        return [convert(v, type_, prop, e) for v, e in zip(col, events, strict=True)]


def _count(out: str, states: list[dict[str, Any]]) -> None:
    for st in states:
        st[out] += 1


def _count_of(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    _count(out, states)


def _sum(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    for st, v in zip(states, col, strict=True):
        st[out] += v


def _min(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    for st, v in zip(states, col, strict=True):
        cur = st[out]
        if cur is None or v < cur:
            st[out] = v


def _max(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    for st, v in zip(states, col, strict=True):
        cur = st[out]
        if cur is None or v > cur:
            st[out] = v


def _first(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    for st, v in zip(states, col, strict=True):
        if st[out] is None:
            st[out] = v


def _last(out: str, states: list[dict[str, Any]], col: list[Any]) -> None:
    for st, v in zip(states, col, strict=True):
        st[out] = v


_APPLY = {"count": _count_of, "sum": _sum, "min": _min, "max": _max, "first": _first, "last": _last}
