"""Declarative aggregations folded inside SQLite: one grouped statement per range of positions
instead of an :class:`~eventlanes.events.Event` per row.

For an aggregation declared with ``fields=`` (:mod:`..declarative`) that reads only the app's
SQLite store, the reader asks SQLite for each key's partial results over up to
:data:`~.base.SPAN` positions (count, sum, minimum, maximum, the first and last value with
their positions) and the worker merges them into the states in memory: 200,000 events over
50,000 keys come back as about 50,000 rows. The range is not materialised in Python, so it may
be much larger than the processor's ``batch_size`` (the events of one read on the row path; an
aggregation's states are written every ``persist_every`` seconds either way).

Exact, or not taken. :meth:`Declaration.fold_batch <..declarative.Declaration.fold_batch>` is the
reference: a range is folded in SQL only when that provably gives the same states, offsets and
dropped counts, and otherwise the same range takes the row path, which raises the errors naming
the event. It is not taken:

* for a declaration with a ``float`` field or ``where`` value, or a ``where`` integer beyond 64
  bits; for processors with several sources (or another store than SQLite); while the held
  segments are at different or merged tokens;
* for a range (checked in the statement and on the rows' text) with an event whose metadata
  may hold a source chain (the fast rule of :func:`~..dedupe.dedupe`, which needs none: a chain
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
  positions from there to the last such event of the next :data:`~.base.SPAN` take the row
  path, which upcasts them in Python. The PostgreSQL Arrow fold upcasts those rows in its batches
  instead (:mod:`.postgres`).

``pushdown.ENABLED = False`` (or ``app.aggregation(..., pushdown=False)``) turns it off. On
PostgreSQL, :mod:`.postgres` gives the same groups from ranges read into Arrow.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any

from ....columnar.json import LONG_TEXT, MAX_OPENERS
from ....store.sqlite import SQLiteEventStore
from ....upcasting import Upcasters
from ..declarative import NAME, Declaration
from . import base
from .base import STAGED, Folded, NotPlaced, Pending, Pushdown, placeable

__all__ = ["SQLitePushdown"]

log = logging.getLogger("eventlanes.aggregation")

try:  # several times faster than the stdlib; the groups hold 64-bit integers at most
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson comes with the spark extra
    from json import loads as _loads  # type: ignore[assignment]

# An exponent of three digits may overflow a float: orjson refuses it where SQLite reads inf.
_EXPONENT = re.compile(r"[eE]\+?[0-9]{3}")
# An integer of over 4,300 digits: Python refuses to read it (a text that long is checked).
_DIGITS = re.compile(r"[0-9]{4000}")
_STRINGS = re.compile(r'"[^"]*"')  # JSON strings of text without backslashes
_ALLOWED = {int: "'integer', 'null'", bool: "'true', 'false', 'null'", str: "'text', 'null'"}


class Unsafe(Exception):
    """The range cannot be folded in SQL exactly: the row path folds it."""


class SQLitePushdown(Pushdown):
    """The statement folding one declaration over a range of a SQLite store."""

    store: SQLiteEventStore

    def __init__(
        self, decl: Declaration, store: SQLiteEventStore, upcasters: Upcasters | None = None
    ) -> None:
        super().__init__(decl, store, upcasters)
        self.sql, self.params, self.props = self._plan(decl, store.events_table)
        #: the statements merging a range in place (None: this declaration is merged in memory)
        self._place = self._place_plan(decl, store.events_table)
        self.places = self._place is not None

    def _plan(self, decl: Declaration, table: str) -> tuple[str, list[Any], list[str]]:
        """The fold: the range's rows (``position > ?1 AND position <= ?2``) grouped by key,
        returned as one row (each row fetched hands the GIL over, and would make this thread
        wait behind the workers): the groups as a JSON array of ``[key, events, first
        position, last position, partial per field...]``, the most failed checks of a group,
        the events and how many have each property. Also :attr:`text_sql`, the range's text
        (checked in Python before the fold)."""
        key = decl.key
        props = [p for p in decl.columns if p != key or uses(decl, p)]
        for p in [key, *props]:  # names go into JSON paths: letters, digits and _ only
            if not NAME.fullmatch(p):
                raise ValueError(f"not a property name: {p!r}")
        col = {p: i for i, p in enumerate(props)}
        rows, bad = row_columns(decl, col)
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
        params, partials, aggregates = field_columns(decl, col)
        values += partials
        grouped += aggregates
        outs = [f"f{j}" for j in range(len(decl.fields))]
        types = list(decl.types)
        first = len(params) + 3
        marks = ", ".join(f"?{first + j}" for j in range(len(types)))
        one = [
            f"json_group_array(json_array({', '.join(['key', 'n', 'lo', 'hi', *outs])}))",
            "max(b)", "sum(n)", *(f"sum(c{i})" for i in col.values()),
        ]  # fmt: skip
        #: the groups as rows: key, n, lo, hi, b, c{i}..., f{j}... (staged by merge_in_place)
        self.grouped_sql = (
            f"SELECT {', '.join(grouped)} FROM "
            f"(SELECT {', '.join(values)} FROM (SELECT {', '.join(rows)} FROM {table} "
            f"WHERE position > ?1 AND position <= ?2 AND type IN ({marks}) LIMIT -1) LIMIT -1) "
            "GROUP BY k"
        )
        sql = f"SELECT {', '.join(one)} FROM ({self.grouped_sql})"
        self.text_sql = text_sql(table, len(types))
        return sql, [*params, *types], props

    # -- reading (the reader's thread) --------------------------------------------------------
    def _native_span(self, after: int, span: int) -> tuple[int, int]:
        """How many positions after ``after`` may be folded in SQL, and (when that is 0) up to
        where the row path must fold: with upcasters into the folded types, a range ends
        before its first event of an old type, and the positions up to the last one within
        :data:`~.base.SPAN` go to the row path. The head is read first: every event up to it is
        committed, so the range (capped there) holds no old event the query did not see."""
        if self.upcasters is None:
            return span, after
        old = sorted(self.upcasters.sources())
        bound = min(self.store.head(), after + span)
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

    def _pending(self, after: int, span: int) -> tuple[list[int] | None, int]:
        return self.store.fold_upto(after, span, partial(self._text_checked, after))

    def fold_exactly(self, after: int, upto: int) -> list[list[Any]] | None:
        with self.store.db.snapshot() as conn:  # type: ignore[attr-defined]
            return self._fold(after, conn, upto)

    def _text_checked(self, after: int, conn: Any, upto: int) -> list[int] | None:
        """The range's text checked, :data:`~.base.TEXT_SPAN` positions at a time: how many
        times each property is named in it, or None when it is not safe to fold in SQL."""
        types = self.params[len(self.params) - len(self.decl.types) :]
        named = [0] * (len(self.props) + 1)
        for low in range(after, upto, base.TEXT_SPAN):
            high = min(upto, low + base.TEXT_SPAN)
            text, longest, meta, meta_longest = conn.execute(
                self.text_sql, (low, high, *types)
            ).fetchone()
            if text is not None and not self._checked(text, longest, named):
                return None
            if meta and not _plain(meta, meta_longest):
                return None
        return named

    def _fold(self, after: int, conn: Any, upto: int) -> list[list[Any]] | None:
        """The groups of ``(after, upto]``, or None when the range is not safe to fold in SQL:
        its text checked first, then the fold."""
        if upto == after:
            return []
        named = self._text_checked(after, conn, upto)
        if named is None:
            return None
        js, bad, *present = conn.execute(self.sql, (after, upto, *self.params)).fetchone()
        if bad or named != [p or 0 for p in present]:  # a property named twice in an event
            return None
        groups: list[list[Any]] = _loads(js)
        return groups if self.locate(groups, 4) else None

    def locate(self, groups: list[list[Any]], first: int) -> bool:
        """The first and last partials of ``groups`` (field ``j`` at ``first + j``) read as
        ``(position, value)`` in place; False when one is not as the row path reads it."""
        placed = [i for i, f in enumerate(self.fields, first) if f.kind >= 4]
        try:
            for g in groups:
                for i in placed:
                    if g[i] is not None:
                        g[i] = _located(g[i], self.fields[i - first].type)
        except Unsafe:
            return False
        return True

    # -- merging in place (the worker's thread) -----------------------------------------------
    def merge_in_place(
        self, name: str, pending: Pending | Folded, store_token: Callable[[Any], None]
    ) -> int | None:
        """The range's groups staged in a temporary table of this thread's connection, in a
        read transaction (appends go on meanwhile), checked as :meth:`_fold` checks them; then
        in one write transaction, one statement upserts them into the states (a state that
        is not as the merge in memory would take it, or a sum past 64 bits, fails the
        statement: nothing is written, None) and ``store_token(conn)`` moves the token."""
        assert self._place is not None and isinstance(pending, Pending)  # :attr:`places`
        db = self.store.db
        after = pending.after
        try:
            with db.snapshot() as conn:  # type: ignore[attr-defined]
                conn.execute(f"DROP TABLE IF EXISTS temp.{STAGED}")
                try:
                    conn.execute(
                        f"CREATE TEMPORARY TABLE {STAGED} AS {self.grouped_sql}",
                        (after, pending.upto, *self.params),
                    )
                    bad, *present = conn.execute(self._place[0]).fetchone()
                except sqlite3.Error as exc:  # malformed JSON, a sum past 64 bits: rows tell
                    log.debug("range after %d not merged in place: %s", after, exc)
                    return None
            if bad or pending.named != [p or 0 for p in present]:
                return None
            with db.transaction() as conn:
                try:
                    conn.execute(self._place[1], {"name": name, "after": after})
                except sqlite3.Error as exc:  # a state the merge in memory would not take
                    log.debug("range after %d not merged in place: %s", after, exc)
                    raise NotPlaced from exc
                store_token(conn)
        except NotPlaced:
            return None
        finally:
            with db.connection() as conn:
                if not conn.in_transaction:
                    conn.execute(f"DROP TABLE IF EXISTS temp.{STAGED}")
        return int(present[0] or 0)

    def _place_plan(self, decl: Declaration, source: str) -> tuple[str, str] | None:
        """The statements of :meth:`merge_in_place`: the staged groups' checks, and the upsert
        merging them as :meth:`~.base.Pushdown.merge` does (None: not for this declaration;
        counts, integer sums, integer and text minimums and maximums only, under plain
        names). A state row is updated only if every field has the type the merge in memory
        takes and its offsets of ``source`` are before the range (``:after``); else its value
        is set to NULL, which the table refuses: the statement fails, nothing is written."""
        if not placeable(decl, source):
            return None
        inserted, merged, ok = [], [], []
        for j, (out, op) in enumerate(decl.fields.items()):
            path = f"'$.{out}'"
            cur = f"json_extract(value, {path})"
            new = f"json_extract(excluded.value, {path})"
            if op.kind in ("count", "sum") and op.type is int:
                inserted.append(f"'{out}', coalesce(f{j}, 0)")
                merged.append(f"{path}, {cur} + {new}")
                ok.append(f"typeof({cur}) = 'integer' AND typeof({cur} + {new}) = 'integer'")
            else:  # a minimum or maximum (placeable)
                cmp = "<" if op.kind == "min" else ">"
                inserted.append(f"'{out}', f{j}")
                merged.append(
                    f"{path}, CASE WHEN {new} IS NOT NULL AND ({cur} IS NULL OR {new} {cmp} "
                    f"{cur}) THEN {new} ELSE {cur} END"
                )
                kind = "integer" if op.type is int else "text"
                ok.append(
                    f"json_type(value, {path}) IS NOT NULL AND typeof({cur}) IN ('{kind}', 'null')"
                )
        own = f"'$.{source}'"
        # No offset of the source, or one before the range (a number: text compares above
        # every number, a missing element is NULL and refuses the row).
        ok.append(
            f"CASE WHEN json_type(offsets, {own}) IS NULL THEN 1 ELSE "
            f"json_extract(offsets, '$.{source}[0]') = '' "
            f"AND json_extract(offsets, '$.{source}[1][0]') <= :after END"
        )
        table = self.store.db.table("aggregates")
        checks = ", ".join(["max(b)", "sum(n)", *(f"sum(c{i})" for i in range(len(self.props)))])
        upsert = (
            f"INSERT INTO {table} (aggregation, key, value, offsets, dropped, dropped_by, "
            f"updated_at) SELECT :name, key, json_object({', '.join(inserted)}), "
            f"json_object('{source}', json_array('', json_array(hi))), 0, NULL, "
            f"{self.store.db.now_ms} FROM temp.{STAGED} WHERE true "
            "ON CONFLICT (aggregation, key) DO UPDATE SET "
            f"value = CASE WHEN {' AND '.join(ok)} THEN json_set(value, {', '.join(merged)}) END, "
            f"offsets = json_set(offsets, {own}, json(json_extract(excluded.offsets, {own}))), "
            "updated_at = excluded.updated_at"
        )
        return f"SELECT {checks} FROM temp.{STAGED}", upsert

    def _checked(self, text: str, longest: int, named: list[int]) -> bool:
        """No escape SQLite and Python read differently, no NUL (SQLite reads up to it), no
        exponent that may overflow (orjson refuses it, SQLite reads inf), no nesting deeper than
        Python's decoders go, no integer longer than Python reads; ``named`` counts each
        ``"name"`` read (an event that has a property names it at least once: the totals
        equal the events that have it only if none names it twice). The text was decoded
        from UTF-8 by sqlite3, which fails on invalid text: SQLite's errors send the range to
        the row path."""
        if "\\u" in text or "\x00" in text:
            return False
        if ("e" in text or "E" in text) and _EXPONENT.search(text):
            return False
        if longest > LONG_TEXT and (
            text.count("[") + text.count("{") > MAX_OPENERS or _DIGITS.search(text)
        ):
            return False
        for j, p in enumerate([self.decl.key, *self.props]):
            named[j] += text.count(f'"{p}"')
        return True


def text_sql(table: str, types: int) -> str:
    """The text of a range's events of ``types`` types (bound after the range), checked in
    Python before a fold: data concatenated and its longest, metadata other than ``{}`` too."""
    return (
        f"SELECT group_concat(data, ''), max(length(data)), group_concat(CASE WHEN "
        f"metadata <> '{{}}' THEN metadata END, ''), max(length(metadata)) FROM {table} "
        f"WHERE position > ? AND position <= ? AND type IN ({', '.join('?' * types)})"
    )


def row_columns(decl: Declaration, col: dict[str, int]) -> tuple[list[str], list[str]]:
    """What the statement reads of each row (key, position, metadata's check, each property's
    JSON type, value and, for first and last, raw text), and its checks that fail the range
    (summed: a group with any is not exact)."""
    # Metadata: only a source chain (or what may hide one) needs the row path; a trace
    # context does not. Malformed JSON fails the statement: the row path names it.
    chained = "json_type(metadata) <> 'object' OR json_type(metadata, '$.source_chain') IS NOT NULL"
    if sqlite3.sqlite_version_info >= (3, 42):
        chained += " OR NOT json_valid(metadata)"
    rows = [f"data -> '$.{decl.key}' AS k", "position AS p",
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
    return rows, bad


def field_columns(decl: Declaration, col: dict[str, int]) -> tuple[list[Any], list[str], list[str]]:
    """Per state field ``j``: what a row adds to it (``e{j}``, null where its ``where`` does
    not match) and its aggregate per key (``f{j}``); with the ``where`` values, bound from
    ``?3`` on."""
    params: list[Any] = []
    partials, aggregates = [], []
    for j, op in enumerate(decl.fields.values()):
        conds = []
        for name, value in op.where:
            i = col[name]
            if type(value) is bool:
                conds.append(f"t{i} = '{'true' if value else 'false'}'")
            else:
                params.append(value)
                conds.append(f"v{i} = ?{len(params) + 2}")
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
        partials.append(
            f"CASE WHEN {cond} THEN {value} END AS e{j}" if cond else f"{value} AS e{j}"
        )
        aggregates.append(f"{agg}(e{j}) AS f{j}")
    return params, partials, aggregates


def _plain(text: str, longest: int) -> bool:
    """Metadata text that SQLite's JSON functions and Python read alike: no backslash (an
    escape could spell ``source_chain``), no NUL, no exponent that may overflow, no nesting
    deeper than Python's decoders go (as :meth:`SQLitePushdown._checked` for data)."""
    if "\\" in text or "\x00" in text:
        return False
    # Outside strings (no backslash: a string is plain quotes to quotes), so the hex digits of
    # a traceparent are not taken for an exponent.
    bare = _STRINGS.sub('""', text)
    if ("e" in bare or "E" in bare) and _EXPONENT.search(bare):
        return False
    return not (
        longest > LONG_TEXT
        and (bare.count("[") + bare.count("{") > MAX_OPENERS or _DIGITS.search(text))
    )


def _located(text: str, type_: type) -> tuple[int, Any]:
    """``printf('%020d', position) || value as JSON``: the position and the value as the row
    path converts it."""
    value = json.loads(text[20:])
    if type_ is str:
        value = value if value.__class__ is str else json.dumps(value)
    elif value.__class__ is not type_:  # checked in SQL: never, but never silently either
        raise Unsafe(text)
    return int(text[:20]), value


def uses(decl: Declaration, prop: str) -> bool:
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
