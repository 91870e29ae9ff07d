"""Windows folded inside SQLite: one statement per range of positions gives each (key, window)
partial of the inputs that are not late, the late inputs, each key's positions (its dedupe
marks) and where the store's clock passes a window's closing time, instead of an
:class:`~eventlanes.events.Event` per input.

The statement decides lateness as the row path does (:mod:`.executor`): an input's clock is
the largest clamped time before it in the log, the range's own (a window function over
positions) or the clock at the range's start, whichever is later. So which input is late
does not depend on how the log was cut into ranges. The clock keeps, of the range, only the
positions where its largest time first reaches each window's closing time, and the last one
where it grew: what closing asks of it (:meth:`.clock.StoreClock.feed_breaks`). Asked
anything else inside such a range (a range folded by rows after all, a token that ends
inside one), the clock reads it again first.

Exact, or not taken, as the keyed pushdown (:mod:`..aggregating.pushdown.sqlite`), whose
checks it shares; besides those, it is taken only for tumbling windows and hopping ones whose
size is a multiple of their step (at most :data:`MAX_HOPS` windows per input), the store's
clock, no ticks, time from ``recorded_at`` or from an integer property with a unit, one held
segment over every key, and ``late="amend"`` only for ranges without a late input. A time
beyond :data:`BOUND` microseconds, or one that is not a whole number, sends its range to the
row path (which reads it, or names it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ...store import EventStore
from ...store.sqlite import SQLiteEventStore
from ...upcasting import Upcasters
from ...windows.durations import UNITS
from ...windows.kinds import Hopping, Tumbling
from ...windows.spec import Windowing
from ...windows.sql import start_sql
from ..aggregating.declarative import NAME, Declaration
from ..aggregating.pushdown import build
from ..aggregating.pushdown.base import Folded, RowSource
from ..aggregating.pushdown.sqlite import (
    SQLitePushdown,
    field_columns,
    row_columns,
    text_sql,
    uses,
)

__all__ = ["BOUND", "MAX_HOPS", "WindowPushdown", "WindowRange", "window_pushdown"]

try:  # as the keyed pushdown: several times faster than the stdlib
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson comes with the spark extra
    from json import loads as _loads  # type: ignore[assignment]

#: times, ``recorded_at`` and durations past this many microseconds (about 73,000 years)
#: take the row path: below it, no sum or difference the statement makes leaves 64 bits
BOUND = 2**61
#: windows per input at most (hopping: size / step) folded in SQL
MAX_HOPS = 64
#: the aggregate merging a field's partials of one window, by kind (first, last: by position)
_MERGED = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "first": "min", "last": "max"}


class WindowRange(Folded):
    """A range folded in SQLite per window: the key groups ``[key, inputs, first position,
    last position]`` (the list itself: dedupe marks and sharing read them), ``windows``
    ``[key, start, partial per field...]`` of the inputs not late, ``late`` ``[position,
    key, time, recorded_at, clock before it]``, the clock's ``breaks`` ``[position, time]``
    and how many times were ``clamped``."""

    __slots__ = ("breaks", "clamped", "late", "windows")

    def __init__(
        self, parts: tuple[Any, ...] | None, after: int, upto: int, reader: RowSource
    ) -> None:
        keys, windows, late, breaks, clamped = parts or ([], [], [], [], 0)
        super().__init__(keys, after, upto, reader)
        self.windows: list[list[Any]] = windows
        self.late: list[list[Any]] = late
        self.breaks: list[list[int]] = breaks
        self.clamped: int = clamped


class WindowPushdown(SQLitePushdown):
    """One windowed declaration folded over ranges of a SQLite store; ``clock_at(position)``:
    the store clock's largest time up to a position (None: none yet)."""

    whole_only = True

    def __init__(
        self,
        decl: Declaration,
        store: SQLiteEventStore,
        spec: Windowing,
        clock_at: Callable[[int], int | None],
    ) -> None:
        window = spec.window
        assert isinstance(window, Tumbling | Hopping)  # window_pushdown says so
        self.spec, self.clock_at = spec, clock_at
        self.size, self.step, self.offset = window.size, window.step, window.offset
        super().__init__(decl, store, None)
        self._place, self.places = None, False  # windows merge in memory

    def _plan(self, decl: Declaration, table: str) -> tuple[str, list[Any], list[str]]:
        """The fold: ``?1``, ``?2`` the range, then the ``where`` values and the types, then
        the clock at the range's start. One row: key groups, windows, late inputs and clock
        breaks as JSON arrays, then the most failed checks of an input, the inputs, how many
        were clamped and how many have each property (the text check compares them)."""
        spec, key = self.spec, decl.key
        props = [p for p in decl.columns if p != key or uses(decl, p)]
        col = {p: i for i, p in enumerate(props)}
        rows, bad = row_columns(decl, col)
        rows.append("recorded_at AS r")
        bad.append(f"(typeof(r) <> 'integer' OR abs(r) > {BOUND})")
        bad.append("(k IS NULL OR substr(k, 1, 1) <> '\"' OR instr(k, '\\') > 0)")
        present = [f"t{i} IS NOT NULL AS c{i}" for i in col.values()]
        counted = [f"c{i}" for i in col.values()]
        time = self._time(rows, bad)
        if (prop := spec.time.prop) is not None and prop not in col:
            present.append("tt IS NOT NULL AS ct")
            counted.append("ct")
            props.append(prop)
        params, partials, aggregates = field_columns(decl, col)
        types = list(decl.types)
        first = len(params) + 3
        marks = ", ".join(f"?{first + j}" for j in range(len(types)))
        clock = f"?{first + len(types)}"
        values = ["k", "p", "r", f"{' + '.join(bad)} AS b", f"{time} AS t", *present, *partials]
        future, late = spec.max_future, spec.lateness
        hops = self.size // self.step
        # Clean: not late for its earliest window, so for none (each window holds a whole
        # step); computed once per input, beside its clock and step.
        inputs = (
            f"SELECT *, (before IS NULL OR last + {self.size - (hops - 1) * self.step} > "
            f"before - {late}) AS clean FROM ("
            f"SELECT *, coalesce(max(lb, {clock}), lb, {clock}) AS before, "
            f"{start_sql('tc', self.step, self.offset)} AS last FROM ("
            "SELECT *, max(tc) OVER (ORDER BY p ROWS BETWEEN UNBOUNDED PRECEDING AND 1 "
            "PRECEDING) AS lb FROM ("
            f"SELECT *, min(t, r + {future}) AS tc, t > r + {future} AS was FROM ("
            f"SELECT {', '.join(values)} FROM (SELECT {', '.join(rows)} FROM {table} "
            f"WHERE position > ?1 AND position <= ?2 AND type IN ({marks}) LIMIT -1) LIMIT -1))))"
        )
        outs = [f"f{j}" for j in range(len(decl.fields))]
        name = "substr(k, 2, length(k) - 2)"
        # Per key and step, every input (the keys' positions) and the partials of the clean
        # ones (one sort of the range).
        kept = [a.replace(f"(e{j})", f"(CASE WHEN clean THEN e{j} END)", 1)
                for j, a in enumerate(aggregates)]  # fmt: skip
        grouped = (
            f"SELECT k, last AS s, count(*) AS n, min(p) AS lo, max(p) AS hi, "
            f"sum(clean) AS ok, {', '.join(kept)} FROM i GROUP BY k, last"
        )
        windows = (
            f"SELECT json_group_array(json_array({', '.join([name, 's', *outs])})) FROM g WHERE ok"
        )
        ctes = [f"i AS MATERIALIZED ({inputs})", f"g AS MATERIALIZED ({grouped})"]
        if hops > 1:
            ctes += self._hopped(decl, hops)
            windows = windows.replace("FROM g WHERE ok", "FROM m")
        selects = [
            f"(SELECT json_group_array(json_array({name}, n, lo, hi)) FROM (SELECT k, sum(n) "
            "AS n, min(lo) AS lo, max(hi) AS hi FROM g GROUP BY k))",
            f"({windows})",
            f"(SELECT json_group_array(json_array(p, {name}, tc, r, before)) FROM (SELECT * "
            "FROM i WHERE NOT clean ORDER BY p))",
            self._breaks(),
            "max(b)", "count(*)", "sum(was)",
            *(f"sum({c})" for c in counted),
        ]  # fmt: skip
        sql = f"WITH {', '.join(ctes)} SELECT {', '.join(selects)} FROM i"
        self.text_sql = text_sql(table, len(types))
        return sql, [*params, *types], props

    def _time(self, rows: list[str], bad: list[str]) -> str:
        """An input's time (unclamped), and what it reads and checks, added to ``rows`` and
        ``bad``: ``recorded_at``, or a whole number of the property's unit within
        :data:`BOUND` (the property's JSON type and value as ``tt``, ``tv``)."""
        time, prop = self.spec.time, self.spec.time.prop
        if prop is None:
            return "r"
        assert time.unit is not None  # window_pushdown says so
        scale = UNITS[time.unit]
        rows += [f"json_type(data, '$.{prop}') AS tt", f"json_extract(data, '$.{prop}') AS tv"]
        bad.append(
            f"(tt IS NOT 'integer' OR typeof(tv) <> 'integer' OR abs(tv) > {BOUND // scale})"
        )
        return f"tv * {scale}"

    def _breaks(self) -> str:
        """The clock's breaks as a JSON array: each input whose time is the largest yet, where
        that reaches a closing time on the windows' end grid (or is the first), and the last
        one."""
        late = self.spec.lateness
        grew = "(before IS NULL OR tc > before)"
        end = (self.offset + self.size) % self.step  # where windows end on the step's grid
        closes = (
            f"{start_sql(f'(tc - {late})', self.step, end)} > "
            f"{start_sql(f'(before - {late})', self.step, end)}"
        )
        return (
            f"(SELECT json_group_array(json_array(p, tc)) FROM (SELECT p, tc FROM i WHERE "
            f"{grew} AND (before IS NULL OR {closes} OR p = (SELECT max(p) FROM i WHERE {grew})) "
            "ORDER BY p))"
        )

    def _hopped(self, decl: Declaration, hops: int) -> list[str]:
        """Hopping windows: each clean group (per key and step) in each of its ``hops``
        windows, and each window of a late input that is still open, merged per window."""
        step, size, late = self.step, self.size, self.spec.lateness
        ones, merged = [], []
        for j, op in enumerate(decl.fields.values()):
            ones.append(f"(e{j} IS NOT NULL) AS f{j}" if op.kind == "count" else f"e{j} AS f{j}")
            merged.append(f"{_MERGED[op.kind]}(f{j}) AS f{j}")
        outs = ", ".join(f"f{j}" for j in range(len(decl.fields)))
        numbers = ", ".join(f"({x})" for x in range(hops))
        shifted = (
            f"SELECT k, s - x * {step} AS s, {outs} FROM g, h WHERE ok UNION ALL "
            f"SELECT k, last - x * {step} AS s, {', '.join(ones)} FROM i, h "
            f"WHERE NOT clean AND last - x * {step} + {size} > before - {late}"
        )
        return [
            f"h(x) AS (VALUES {numbers})",
            f"m AS (SELECT k, s, {', '.join(merged)} FROM ({shifted}) GROUP BY k, s)",
        ]

    # -- reading (the reader's thread) --------------------------------------------------------
    def _range(self, after: int, span: int) -> tuple[Any, int]:
        start = self.clock_at(after)  # before the read transaction: it may read a checkpoint
        return self.store.fold_upto(after, span, partial(self._fold_windows, after, start))

    def folded(self, groups: Any, after: int, upto: int, reader: RowSource) -> Folded:
        return WindowRange(groups, after, upto, reader)

    def _fold_windows(
        self, after: int, start: int | None, conn: Any, upto: int
    ) -> tuple[Any, ...] | None:
        """The parts of :class:`WindowRange` for ``(after, upto]``, or None when the range is
        not safe to fold in SQL: its text checked first, then the fold."""
        if upto == after:
            return [], [], [], [], 0
        named = self._text_checked(after, conn, upto)
        if named is None:
            return None
        row = conn.execute(self.sql, (after, upto, *self.params, start)).fetchone()
        keys, windows, late, breaks, bad, inputs, clamped, *present = row
        if bad or named != [inputs, *(p or 0 for p in present)]:
            return None
        late_rows = _loads(late)
        if late_rows and self.spec.late == "amend":  # amendments fold by rows
            return None
        groups: list[list[Any]] = _loads(windows)
        if not self.locate(groups, 2):
            return None
        return _loads(keys), groups, late_rows, _loads(breaks), clamped or 0


def window_pushdown(
    decl: Declaration | None,
    stores: Sequence[EventStore],
    enabled: bool,
    spec: Windowing,
    types: frozenset[str] | None,
    upcasters: Upcasters | None,
    clock_at: Callable[[int], int | None] | None,
) -> WindowPushdown | None:
    """The pushdown of a windowed declaration ``decl`` reading ``types``, when its windows,
    time and clock can be folded in SQLite (else None: the row path)."""
    keyed = build(decl, list(stores), enabled, upcasters)
    if not isinstance(keyed, SQLitePushdown) or keyed.upcasters is not None:
        return None
    assert decl is not None  # built
    window, time = spec.window, spec.time
    durations = [spec.lateness, spec.max_future, spec.retain]
    if isinstance(window, Tumbling):
        durations += [window.size, window.offset]
    elif isinstance(window, Hopping) and window.size % window.every == 0:
        durations += [window.size, window.every, window.offset]
        if window.size // window.every > MAX_HOPS:
            return None
    else:
        return None
    if (
        clock_at is None
        or spec.clock != "store"
        or spec.idle_close is not None
        or types != frozenset(decl.types)
        or (time.prop is not None and (time.unit is None or not NAME.fullmatch(time.prop)))
        or max(durations) >= BOUND
    ):
        return None
    assert isinstance(keyed.store, SQLiteEventStore)
    return WindowPushdown(decl, keyed.store, spec, clock_at)
