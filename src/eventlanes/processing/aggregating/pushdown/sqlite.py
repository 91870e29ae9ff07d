"""Declarative aggregations folded inside SQLite: one grouped statement per range of positions
instead of an :class:`~eventlanes.events.Event` per row.

For an aggregation declared with ``fields=`` (:mod:`.declarative`) that reads only the app's
SQLite store, the reader asks SQLite for each key's partial results over up to :data:`SPAN`
positions (count, sum, minimum, maximum, the first and last value with their positions) and the
worker merges them into the states in memory: 200,000 events over 50,000 keys come back as about
50,000 rows. The range is not materialised in Python, so it may be much larger than the
processor's ``batch_size`` (the events of one read on the row path; an aggregation's states are
written every ``persist_every`` seconds either way).

Exact, or not taken. :meth:`Declaration.fold_batch <.declarative.Declaration.fold_batch>` is the
reference: a range is folded in SQL only when that provably gives the same states, offsets and
dropped counts, and otherwise the same range takes the row path, which raises the errors naming
the event. It is not taken:

* for a declaration with a ``float`` field or ``where`` value, or a ``where`` integer beyond 64
  bits; for processors with several sources (or another store than SQLite); while the held
  segments are at different or merged tokens;
* for a range (checked in the statement and on the rows' text) with an event whose metadata
  may hold a source chain (the fast rule of :func:`.chains.dedupe`, which needs none: a chain
  must be checked event by event): one that names ``source_chain``, is not a JSON object, or
  has text SQLite and Python might read differently (any backslash, NUL, a three-digit
  exponent, deep nesting); metadata holding other keys only (a trace context) stays fast;
  a value of the wrong type or an integer beyond 64 bits, a key that is
  not a JSON string or has escapes, a property named twice, or JSON text that SQLite reads but
  Python reads differently or refuses (``\\u`` escapes, NUL, an exponent of three digits,
  nesting over 400 deep, text that is not UTF-8, JSON5 where SQLite reads it); or when SQLite
  fails (malformed JSON, a sum beyond 64 bits);
* by a segment whose states hold an own position at or above the range's first (a replay
  after a reset, inputs folded already): the worker folds that range by the row path;
* for events of an old type that an upcaster turns into a folded one
  (:mod:`eventlanes.upcasting`): SQL cannot run the user's function, so a range is folded in
  SQLite only up to the first such event (found by the ``(type, position)`` index), and the
  positions from there to the last such event of the next :data:`SPAN` take the row path,
  which upcasts them in Python. The PostgreSQL Arrow fold upcasts those rows in its batches
  instead (:mod:`.pushdown_postgres`).

``ENABLED = False`` (or ``app.aggregation(..., pushdown=False)``) turns it off. On
PostgreSQL, :mod:`.pushdown_postgres` gives the same groups from ranges read into Arrow.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from ....hashing import stable_hash
from ....store import EventStore
from ....store.postgres import PostgresEventStore
from ....store.sqlite import SQLiteEventStore
from ....upcasting import Upcasters
from ...tables.states import Entry
from ..declarative import _INT64, NAME, Declaration
from ..dedupe import Marks

if TYPE_CHECKING:
    from ...segment import SegmentState

__all__ = ["ENABLED", "SPAN", "Folded", "Pushdown"]

log = logging.getLogger("eventlanes.aggregation")

try:  # several times faster than the stdlib; the groups hold 64-bit integers at most
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson comes with the spark extra
    from json import loads as _loads  # type: ignore[assignment]

#: the pushdown is tried at all (tests turn it off to compare with the row path)
ENABLED = True
#: positions folded per statement: larger ranges return fewer rows per event (a key seen
#: several times in the range comes back once). It bounds the memory of a range: the states
#: loaded for it (one per key), the groups; SQLite's sorter spills to disk past its cache.
SPAN = 400_000
#: positions whose text is checked at once (the check's memory)
TEXT_SPAN = 50_000
#: data longer than this may nest deeper than Python's decoders go: its brackets are counted
_LONG = 800
_MAX_OPENERS = 400
# An exponent of three digits may overflow a float: orjson refuses it where SQLite reads inf.
_EXPONENT = re.compile(r"[eE]\+?[0-9]{3}")
_STRINGS = re.compile(r'"[^"]*"')  # JSON strings of text without backslashes
_ALLOWED = {int: "'integer', 'null'", bool: "'true', 'false', 'null'", str: "'text', 'null'"}
_KIND = {"count": 0, "sum": 1, "min": 2, "max": 3, "first": 4, "last": 5}


class Unsafe(Exception):
    """The range cannot be folded in SQL exactly: the row path folds it."""


@dataclass(frozen=True)
class _Field:
    out: str
    kind: int
    type: type


class RowSource(Protocol):
    """What a folded range needs of the reader that folded it (the reader, seen from here
    without importing it): its pushdown, and the range's events read again by rows."""

    pushdown: Pushdown | None

    def rows_between(
        self, st: SegmentState, after: int, upto: int, batch_size: int
    ) -> Iterator[list[Any]]: ...


class Folded(list[list[Any]]):
    """One range folded in SQL: per key ``(key, events, first position, last position,
    partial per field...)``, with ``events`` in all, the range ``(after, upto]`` and the
    reader to fold it by rows when a segment cannot take it as it is."""

    __slots__ = ("after", "events", "reader", "upto")

    def __init__(
        self, groups: Iterable[list[Any]], after: int, upto: int, reader: RowSource
    ) -> None:
        super().__init__(groups)
        self.after = after
        self.upto = upto
        self.reader = reader
        self.events = sum(g[1] for g in self)

    def part(self, groups: list[list[Any]]) -> Folded:
        return Folded(groups, self.after, self.upto, self.reader)

    def rows(self, st: SegmentState, batch_size: int) -> Iterator[list[Any]]:
        """The range's events for ``st``, read again, in batches (the row path)."""
        return self.reader.rows_between(st, self.after, self.upto, batch_size)


class Pushdown:
    """The statement folding one declaration over a range of a SQLite store (a subclass: of a
    PostgreSQL store, in Arrow), and the merge of its rows into states."""

    store: Any  # SQLiteEventStore here, PostgresEventStore in pushdown_postgres
    #: events of old types upcast into folded ones take the row path (SQL cannot upcast)
    old_by_rows = True

    def __init__(
        self, decl: Declaration, store: EventStore, upcasters: Upcasters | None = None
    ) -> None:
        self.decl = decl
        self.store = store
        #: the upcasters into the folded types (None: none)
        self.upcasters = upcasters
        self.fields: list[_Field] = []
        self.sql, self.params, self.props = self._plan(decl, store.events_table)
        #: positions below which reads take the row path (a range refused lately)
        self.rows_until = 0
        self._last: Folded | None = None

    @staticmethod
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
        postgres = isinstance(store, PostgresEventStore)
        if not (postgres or isinstance(store, SQLiteEventStore)) or float in decl.columns.values():
            return None
        for op in decl.fields.values():
            for _, value in op.where:
                if type(value) is int and not _INT64[0] <= value <= _INT64[1]:
                    return None
                if type(value) is str and (not _encodes(value) or "\x00" in value):
                    return None
        if postgres:
            if not all(importlib.util.find_spec(m) for m in ("pyarrow", "adbc_driver_postgresql")):
                return None  # without the arrow extra: the row path
            from .postgres import PostgresPushdown

            return PostgresPushdown(decl, store, upcasters)  # type: ignore[arg-type]
        return Pushdown(decl, store, upcasters)

    def _plan(self, decl: Declaration, table: str) -> tuple[str, list[Any], list[str]]:
        """The fold: the range's rows (``position > ?1 AND position <= ?2``) grouped by key,
        returned as one row (each row fetched hands the GIL over, and would make this thread
        wait behind the workers): the groups as a JSON array of ``[key, events, first
        position, last position, partial per field...]``, the most failed checks of a group,
        the events and how many have each property."""
        key = decl.key
        props = [p for p in decl.columns if p != key or _uses(decl, p)]
        for p in [key, *props]:  # names go into JSON paths: letters, digits and _ only
            if not NAME.fullmatch(p):
                raise ValueError(f"not a property name: {p!r}")
        col = {p: i for i, p in enumerate(props)}
        # Metadata: only a source chain (or what may hide one) needs the row path; a trace
        # context does not. Malformed JSON fails the statement: the row path names it.
        chained = (
            "json_type(metadata) <> 'object' OR json_type(metadata, '$.source_chain') IS NOT NULL"
        )
        if sqlite3.sqlite_version_info >= (3, 42):
            chained += " OR NOT json_valid(metadata)"
        rows = [f"data -> '$.{key}' AS k", "position AS p",
                f"(metadata <> '{{}}' AND ({chained})) AS m"]  # fmt: skip
        bad = ["m"]
        if sqlite3.sqlite_version_info >= (3, 42):  # JSON5 is read too: only strict JSON here
            rows.append("NOT json_valid(data) AS j")
            bad.append("j")
        for p, i in col.items():
            type_ = decl.columns[p]
            rows.append(f"json_type(data, '$.{p}') AS t{i}")
            rows.append(f"json_extract(data, '$.{p}') AS v{i}")
            if type_ is not str or _needs_text(decl, p):
                bad.append(f"coalesce(t{i} NOT IN ({_ALLOWED[type_]}), 0)")
            if type_ is int:
                bad.append(f"(typeof(v{i}) = 'real')")  # beyond 64 bits: read as a float
            if _raw(decl, p):
                rows.append(f"data -> '$.{p}' AS r{i}")
        # What each row adds, computed before the sort (smaller records to sort).
        values = [
            "k",
            "p",
            f"{' + '.join(bad)} AS b",
            *(f"t{i} IS NOT NULL AS c{i}" for i in col.values()),
        ]
        # A key must be a JSON string without escapes: its text between the quotes is the key.
        keyed = "k IS NULL OR substr(k, 1, 1) <> '\"' OR instr(k, '\\') > 0"
        grouped = [
            "substr(k, 2, length(k) - 2) AS key", "count(*) AS n", "min(p) AS lo", "max(p) AS hi",
            f"sum(b) + ({keyed}) AS b", *(f"sum(c{i}) AS c{i}" for i in col.values()),
        ]  # fmt: skip
        params: list[Any] = []
        outs = []
        for j, (out, op) in enumerate(decl.fields.items()):
            conds = []
            for name, value in op.where:
                i = col[name]
                if type(value) is bool:
                    conds.append(f"t{i} = '{'true' if value else 'false'}'")
                else:
                    params.append(value)
                    conds.append(f"v{i} = ?{len(params) + 2}")
            self.fields.append(_Field(out, _KIND[op.kind], op.type))
            outs.append(f"f{j}")
            if op.field is None:
                value, agg = "1", "count"
            elif op.kind in ("first", "last"):
                i = col[op.field]
                conds.append(f"t{i} <> 'null'")
                value = f"printf('%020d', p) || r{i}"
                agg = "min" if op.kind == "first" else "max"
            else:
                value, agg = f"v{col[op.field]}", op.kind
            cond = " AND ".join(conds)
            values.append(
                f"CASE WHEN {cond} THEN {value} END AS e{j}" if cond else f"{value} AS e{j}"
            )
            grouped.append(f"{agg}(e{j}) AS f{j}")
        types = list(decl.types)
        first = len(params) + 3
        marks = ", ".join(f"?{first + j}" for j in range(len(types)))
        one = [
            f"json_group_array(json_array({', '.join(['key', 'n', 'lo', 'hi', *outs])}))",
            "max(b)", "sum(n)", *(f"sum(c{i})" for i in col.values()),
        ]  # fmt: skip
        sql = (
            f"SELECT {', '.join(one)} FROM (SELECT {', '.join(grouped)} FROM "
            f"(SELECT {', '.join(values)} FROM (SELECT {', '.join(rows)} FROM {table} "
            f"WHERE position > ?1 AND position <= ?2 AND type IN ({marks}) LIMIT -1) LIMIT -1) "
            "GROUP BY k)"
        )
        self.text_sql = (
            f"SELECT group_concat(data, ''), max(length(data)), group_concat(CASE WHEN "
            f"metadata <> '{{}}' THEN metadata END, ''), max(length(metadata)) FROM {table} "
            f"WHERE position > ? AND position <= ? AND type IN ({', '.join('?' * len(types))})"
        )
        return sql, [*params, *types], props

    # -- reading (the reader's thread) --------------------------------------------------------
    def read(self, after: int, reader: RowSource) -> tuple[Folded | None, int]:
        """The range after ``after`` folded in SQL, and its end; None when it must take the
        row path (then reads take it up to the range's end). The last range folded is kept: a
        read ahead that the loop let go (it does at every coordination round, about every
        second, shorter than a large range takes) is asked for again from the same position,
        and the events up to its end do not change. It is only data: states change when a
        worker merges it, once per hand-out, as with events read again."""
        last = self._last
        if last is not None and last.after == after and last.reader is reader:
            return last, last.upto
        try:
            span, old_until = self._native_span(after)
            if span == 0 and old_until > after:  # an old shape first: upcast by the row path
                self.rows_until = old_until
                return None, old_until
            groups, upto = self._range(after, span)
        except Exception as exc:  # noqa: BLE001 - SQLite's errors included: the row path tells
            log.debug("range after %d folded by rows: %s", after, exc)
            self.rows_until = after + SPAN
            return None, after
        if groups is None:
            self.rows_until = upto
            return None, upto
        folded = Folded(groups, after, upto, reader)
        if folded:  # an empty range is cheap, and at the head it would hide what comes next
            self._last = folded
        return folded, upto

    def _native_span(self, after: int) -> tuple[int, int]:
        """How many positions after ``after`` may be folded in SQL, and (when that is 0) up to
        where the row path must fold: with upcasters into the folded types, a range ends
        before its first event of an old type, and the positions up to the last one within
        :data:`SPAN` go to the row path. The head is read first: every event up to it is
        committed, so the range (capped there) holds no old event the query did not see."""
        if self.upcasters is None or not self.old_by_rows:
            return SPAN, after
        old = sorted(self.upcasters.sources())
        bound = min(self.store.head(), after + SPAN)
        sql = self.store.db.sql(
            f"SELECT min(position), max(position) FROM {self.store.events_table} "
            f"WHERE type IN ({', '.join('?' * len(old))}) AND position > ? AND position <= ?"
        )
        first, last = self.store.db.query(sql, (*old, after, bound))[0]
        if first is None:
            return bound - after, after
        return first - 1 - after, last

    def _range(self, after: int, span: int) -> tuple[list[list[Any]] | None, int]:
        """The groups of the range after ``after`` (at most ``span`` positions, up to what a
        reader may see) and its end; None instead of groups: not exact (the row path)."""
        return self.store.fold_upto(after, span, partial(self._fold, after))

    def _fold(self, after: int, conn: Any, upto: int) -> list[list[Any]] | None:
        """The groups of ``(after, upto]``, or None when the range is not safe to fold in SQL:
        its text checked first, :data:`TEXT_SPAN` positions at a time, then the fold."""
        if upto == after:
            return []
        types = self.params[len(self.params) - len(self.decl.types) :]
        named = [0] * (len(self.props) + 1)
        for low in range(after, upto, TEXT_SPAN):
            high = min(upto, low + TEXT_SPAN)
            text, longest, meta, meta_longest = conn.execute(
                self.text_sql, (low, high, *types)
            ).fetchone()
            if text is not None and not self._checked(text, longest, named):
                return None
            if meta and not _plain(meta, meta_longest):
                return None
        js, bad, *present = conn.execute(self.sql, (after, upto, *self.params)).fetchone()
        if bad or named != [p or 0 for p in present]:  # a property named twice in an event
            return None
        groups: list[list[Any]] = _loads(js)
        located = [i for i, f in enumerate(self.fields, 4) if f.kind >= 4]
        if located:
            try:
                for g in groups:
                    for i in located:
                        if g[i] is not None:
                            g[i] = _located(g[i], self.fields[i - 4].type)
            except Unsafe:
                return None
        return groups

    def _checked(self, text: str, longest: int, named: list[int]) -> bool:
        """No escape SQLite and Python read differently, no NUL (SQLite reads up to it), no
        exponent that may overflow (orjson refuses it, SQLite reads inf), no nesting deeper than
        Python's decoders go; ``named`` counts each ``"name"`` read (an event that has a
        property names it at least once: the totals equal the events that have it only if
        none names it twice). The text was decoded from UTF-8 by sqlite3, which fails on
        invalid text: SQLite's errors send the range to the row path."""
        if "\\u" in text or "\x00" in text:
            return False
        if ("e" in text or "E" in text) and _EXPONENT.search(text):
            return False
        if longest > _LONG and text.count("[") + text.count("{") > _MAX_OPENERS:
            return False
        for j, p in enumerate([self.decl.key, *self.props]):
            named[j] += text.count(f'"{p}"')
        return True

    # -- merging (the worker's thread) --------------------------------------------------------
    def merge(self, folded: Folded, entries: dict[str, Entry], marks: Marks, source: str) -> bool:
        """Fold ``folded`` (one segment's share, every key in ``entries``) into the states, as
        the row path's dedupe fast rule does: False (nothing changed) when a state holds an own
        position at or above the range's first event."""
        bound = marks.high.get(source)
        if bound is not None and min(g[2] for g in folded) <= bound:
            return False
        fields = [(f.out, f.kind, i) for i, f in enumerate(self.fields, 4)]
        for g in folded:
            st = entries[g[0]].value
            for out, kind, i in fields:
                v = g[i]
                if kind == 0:
                    st[out] += v
                elif v is None:
                    continue
                elif kind == 1:
                    st[out] += v
                elif kind == 2:
                    cur = st[out]
                    if cur is None or v < cur:
                        st[out] = v
                elif kind == 3:
                    cur = st[out]
                    if cur is None or v > cur:
                        st[out] = v
                elif kind == 4:
                    if st[out] is None:
                        st[out] = v[1]
                else:
                    st[out] = v[1]
        pending = marks.pending.setdefault(source, {})
        for g in folded:
            pending[g[0]] = g[3]
        marks.high[source] = max(g[3] for g in folded)
        return True

    def share(self, folded: Folded, states: list[SegmentState]) -> dict[SegmentState, list[Any]]:
        """Each group to the held segment of its key (by the key's stable hash)."""
        if len(states) == 1 and states[0].segment.mask == 0:
            return {states[0]: folded}
        parts: dict[SegmentState, list[list[Any]]] = {st: [] for st in states}
        by_mask: dict[int, dict[int, SegmentState]] = {}
        for st in states:
            by_mask.setdefault(st.segment.mask, {})[st.segment.id] = st
        for g in folded:
            h = stable_hash(g[0])
            for mask, ids in by_mask.items():
                owner = ids.get(h & mask)
                if owner is not None:
                    parts[owner].append(g)
                    break
        return {st: folded.part(gs) if gs else [] for st, gs in parts.items()}


def _plain(text: str, longest: int) -> bool:
    """Metadata text that SQLite's JSON functions and Python read alike: no backslash (an
    escape could spell ``source_chain``), no NUL, no exponent that may overflow, no nesting
    deeper than Python's decoders go (as :meth:`Pushdown._checked` for data)."""
    if "\\" in text or "\x00" in text:
        return False
    # Outside strings (no backslash: a string is plain quotes to quotes), so the hex digits of
    # a traceparent are not taken for an exponent.
    bare = _STRINGS.sub('""', text)
    if ("e" in bare or "E" in bare) and _EXPONENT.search(bare):
        return False
    return not (longest > _LONG and bare.count("[") + bare.count("{") > _MAX_OPENERS)


def _located(text: str, type_: type) -> tuple[int, Any]:
    """``printf('%020d', position) || value as JSON``: the position and the value as the row
    path converts it."""
    value = json.loads(text[20:])
    if type_ is str:
        value = value if value.__class__ is str else json.dumps(value)
    elif value.__class__ is not type_:  # checked in SQL: never, but never silently either
        raise Unsafe(text)
    return int(text[:20]), value


def _uses(decl: Declaration, prop: str) -> bool:
    return any(
        op.field == prop or any(n == prop for n, _ in op.where) for op in decl.fields.values()
    )


def _needs_text(decl: Declaration, prop: str) -> bool:
    """A str property compared (min, max, where) must hold JSON strings: the row path compares
    other values as their JSON text, which SQLite does not render alike."""
    return any(
        (op.field == prop and op.kind in ("min", "max")) or any(n == prop for n, _ in op.where)
        for op in decl.fields.values()
    )


def _raw(decl: Declaration, prop: str) -> bool:
    return any(op.field == prop and op.kind in ("first", "last") for op in decl.fields.values())


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
