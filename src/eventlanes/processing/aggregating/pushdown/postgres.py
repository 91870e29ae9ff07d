"""The pushdown (:mod:`.base`) on PostgreSQL: a declarative aggregation's ranges read
straight into Arrow (binary COPY, ``scan_arrow``) and folded there
(:mod:`eventlanes.columnar.fold`, pyarrow's hash aggregates), instead of an
:class:`~eventlanes.events.Event` per row; returned as the groups the SQLite statement
returns and merged the same way. It needs the ``arrow`` extra (pyarrow and the ADBC
drivers); without it, ranges take the row path.

With one segment over every key (and no upcaster), a range whose fields the database can
merge (:func:`.base.placeable`) is not read at all: PostgreSQL groups it into a temporary
table (:func:`grouping`, with checks that refuse what Python would read otherwise) and merges
that into the states with the token (:meth:`PostgresPushdown.merge_in_place`). A refused
range is read into Arrow as above.

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

import json
import logging
from collections.abc import Callable
from typing import Any

from ....columnar.json import LONG_TEXT, MAX_OPENERS
from ....store.postgres import PostgresEventStore
from ....upcasting import Upcasters
from ....upcasting.arrow import upcast_batch
from ..declarative import NAME, Declaration
from .base import STAGED, Folded, NotPlaced, Pending, Pushdown, placeable

log = logging.getLogger("eventlanes.aggregation")


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
        #: the statements merging a range's groups in place (None: merged in memory)
        self._place = self._place_plan(decl, store.events_table)
        self.places_folded = self._place is not None
        #: a range is grouped inside PostgreSQL and merged there (old shapes need Python)
        self._group = grouping(decl, store.events_table) if self._place is not None else None
        self.places = self._group is not None and upcasters is None

    def _range(self, after: int, span: int) -> tuple[list[list[Any]] | None, int]:
        upto = max(after, min(self.store.horizon(), after + span))
        return self.fold_exactly(after, upto), upto

    def _pending(self, after: int, span: int) -> tuple[list[int] | None, int]:
        """A range up to the visibility horizon, to be grouped and checked by the worker's
        statement (:meth:`merge_in_place`): its end and its events."""
        upto = max(after, min(self.store.horizon(), after + span))
        sql = (
            f"SELECT count(*) FROM {self.store.events_table} WHERE position > %s "
            "AND position <= %s AND type = ANY(%s)"
        )
        return [self.store.db.query(sql, (after, upto, self.types))[0][0]], upto

    def fold_exactly(self, after: int, upto: int) -> list[list[Any]] | None:
        import pyarrow as pa

        from ....columnar.fold import groups

        if upto == after:
            return []
        columns: list[str] | None = ["position", "data", "metadata"]
        if self.upcasters is not None:
            columns = None  # an upcaster is given the whole event
        batches = list(self.store.scan_arrow(after, upto, types=self.types, columns=columns))
        if not batches:
            return []
        if self.upcasters is not None:  # UpcastError: the range takes the row path
            batches = [upcast_batch(self.upcasters, b) for b in batches]
        table = pa.Table.from_batches(batches)
        return groups(table, self.decl.key, self.kinds, self.spec)

    # -- merging in place (the worker's thread) -----------------------------------------------
    def merge_in_place(
        self, name: str, pending: Pending | Folded, store_token: Callable[[Any], None]
    ) -> int | None:
        """The range's groups merged into the states by one statement, and
        ``store_token(conn)``, in one transaction: the events merged, or None when nothing
        was written. A :class:`~.base.Pending` range is grouped by PostgreSQL into a temporary
        table, with the checks of :func:`grouping` (an event the row path would read
        otherwise: not merged); a :class:`~.base.Folded` one (grouped in Arrow by the reader)
        is copied into it. A stored state the merge in memory would not take as it is fails
        the upsert (a sum past 64 bits, a field of another type, offsets at or past the
        range), as does a role that may not create temporary tables."""
        assert self._place is not None
        import psycopg  # here: executors import this module, and may have no psycopg

        create, copy_in, upsert = self._place
        db = self.store.db
        outs = range(4, 4 + len(self.fields))
        try:
            with db.transaction() as conn:
                try:
                    with conn.transaction():  # a savepoint: its failure leaves the rest
                        if isinstance(pending, Pending):
                            assert self._group is not None
                            sql, params = self._group
                            bounds = {"after": pending.after, "upto": pending.upto}
                            conn.execute(sql, {**params, **bounds, "types": self.types})
                            bad, events = conn.execute(
                                f"SELECT max(bad), sum(n) FROM {STAGED}"
                            ).fetchone()
                            if bad or (events or 0) != pending.events:
                                raise NotPlaced("not exact: the row path reads it")
                        else:
                            events = pending.events
                            conn.execute(create)
                            with conn.cursor().copy(copy_in) as copy:
                                for g in pending:
                                    copy.write_row([g[0], g[3], *(g[i] for i in outs)])
                        conn.execute(upsert, {"name": name, "after": pending.after})
                except psycopg.Error as exc:
                    log.debug("range after %d not merged in place: %s", pending.after, exc)
                    raise NotPlaced from exc
                store_token(conn)
        except NotPlaced:
            return None
        return int(events or 0)

    def _place_plan(self, decl: Declaration, source: str) -> tuple[str, str, str] | None:
        """The statements of :meth:`merge_in_place` (None: not for this declaration; as on
        SQLite, counts, integer sums, integer and text minimums and maximums, plain names):
        one upsert, whose inserted row holds the range's partials (the state of a new key).
        A stored field is read as its JSON text (``json``, not ``jsonb``, which rewrites
        ``5e3`` as 5000) through checks that fail the statement where the merge in memory
        would not take it as it is: another type gives NULL (the table refuses it), a number
        that is not a 64-bit integer fails its cast. Text compares by code point
        (``COLLATE "C"``), as Python."""
        if not placeable(decl, source):
            return None
        table = self.store.db.table("aggregates")
        stored, part = f"{table}.value::json", "excluded.value::json"
        columns, inserted, merged = ["key TEXT NOT NULL", "hi BIGINT NOT NULL"], [], stored
        merged += "::jsonb"
        for j, (out, op) in enumerate(decl.fields.items()):
            got, text, new = f"json_typeof({stored} -> '{out}')", f"({stored} ->> '{out}')", ""
            if op.kind in ("count", "sum") and op.type is int:
                columns.append(f"f{j} BIGINT")
                inserted.append(f"'{out}', coalesce(f{j}, 0)")
                new = (
                    f"CASE WHEN {got} = 'number' THEN to_jsonb({text}::bigint + "
                    f"({part} ->> '{out}')::bigint) END"
                )
            else:  # a minimum or maximum (placeable)
                kind, cast = ("number", "::bigint") if op.type is int else (
                    "string", ' COLLATE "C"')  # fmt: skip
                columns.append(f"f{j} {'BIGINT' if op.type is int else 'TEXT'}")
                inserted.append(f"'{out}', f{j}")
                pick = "least" if op.kind == "min" else "greatest"  # both skip a NULL
                value = f"CASE WHEN {got} = '{kind}' THEN {text}{cast} END"
                new = (
                    f"CASE WHEN {got} IN ('{kind}', 'null') THEN coalesce(to_jsonb({pick}("
                    f"{value}, ({part} ->> '{out}'){cast})), 'null'::jsonb) END"
                )
            merged = f"jsonb_set({merged}, '{{{out}}}', {new})"
        offsets = f"{table}.offsets::jsonb"
        own = (
            f"(NOT {offsets} ? '{source}' OR ({offsets} -> '{source}' ->> 0 = '' "
            f"AND ({offsets} -> '{source}' -> 1 ->> 0)::bigint <= %(after)s))"
        )
        create = f"CREATE TEMPORARY TABLE {STAGED} ({', '.join(columns)}) ON COMMIT DROP"
        fields = ", ".join(f"f{j}" for j in range(len(decl.fields)))
        copy_in = f"COPY {STAGED} (key, hi, {fields}) FROM STDIN"
        now = self.store.db.now_ms
        upsert = (
            f"INSERT INTO {table} (aggregation, key, value, offsets, dropped, dropped_by, "
            f"updated_at) SELECT %(name)s, key, json_build_object({', '.join(inserted)})::text, "
            f"json_build_object('{source}', json_build_array('', json_build_array(hi)))::text, "
            f"0, NULL, {now} FROM {STAGED} ON CONFLICT (aggregation, key) DO UPDATE SET "
            f"value = CASE WHEN {own} THEN ({merged})::text END, "
            f"offsets = jsonb_set({offsets}, '{{{source}}}', "
            f"excluded.offsets::jsonb -> '{source}')::text, updated_at = excluded.updated_at"
        )
        return create, copy_in, upsert


_JSON_TYPE = {int: "number", bool: "boolean", str: "string"}
#: a run of 4,000 digits: Python refuses an integer past 4,300 (PostgreSQL's regular
#: expressions repeat at most 255 times)
_DIGITS = "([0-9]{200}){20}"


def grouping(decl: Declaration, table: str) -> tuple[str, dict[str, Any]] | None:
    """The statement grouping a range ``(%(after)s, %(upto)s]`` of events of
    ``%(types)s`` inside PostgreSQL into the temporary table the upsert of
    :meth:`PostgresPushdown._place_plan` reads (``key``, ``hi``, ``f{j}``), with ``n`` the
    events and ``bad`` 1 when an event would be read otherwise by the row path (the
    reference, which decodes ``data::text`` in Python): a key that is not a JSON string;
    metadata that is not an object or names ``source_chain`` (the dedupe's fast rule); a
    declared property of another JSON type, or an integer property whose text is not a
    64-bit integer (``5.0`` is a float in Python); text nested deeper or with a number
    longer than Python's decoders take (4,000 digits in a row: PostgreSQL writes
    ``1e5000`` out). A sum past 64 bits fails the statement (its cast). None: names that
    are not plain (the caller checked that every field is placeable)."""
    if not all(NAME.fullmatch(p) for p in decl.columns):
        return None
    params: dict[str, Any] = {}
    # Each property is taken out of the data once, by a subquery (``OFFSET 0``: not merged
    # into the outer one, which would take it out again for each use).
    x = {p: f"x{i}" for i, p in enumerate(decl.columns)}

    def unread(col: str) -> str:
        """What Python's decoder refuses, in a long text: deep nesting or a long number (a
        jsonb value's size says nothing of its text's: ``1e5000`` is stored in a few bytes)."""
        text = f"{col}::text"
        return (
            f"(octet_length({text}) > {LONG_TEXT} AND (octet_length({text}) - "
            f"octet_length(translate({text}, '[{{', '')) > {MAX_OPENERS} "
            f"OR {text} ~ '{_DIGITS}'))"
        )

    bad = [
        f"jsonb_typeof({x[decl.key]}) IS DISTINCT FROM 'string'",
        "NOT (jsonb_typeof(metadata) = 'object' AND NOT metadata ? 'source_chain')",
        unread("data"),
        f"(metadata <> '{{}}'::jsonb AND {unread('metadata')})",
    ]
    for p, type_ in decl.columns.items():
        got = f"jsonb_typeof({x[p]})"
        bad.append(f"coalesce({got} NOT IN ('{_JSON_TYPE[type_]}', 'null'), false)")
        if type_ is int:  # written as an integer (no fraction: PostgreSQL's text has no
            # exponent), within 64 bits: the int Python reads from that text
            bad.append(
                f"({got} = 'number' AND NOT (scale({x[p]}::numeric) = 0 AND {x[p]}::numeric "
                "BETWEEN -9223372036854775808 AND 9223372036854775807))"
            )
    aggregates = []
    for j, op in enumerate(decl.fields.values()):
        conds = []
        for name, value in op.where:
            params[f"w{len(params)}"] = json.dumps(value)
            conds.append(f"{x[name]} = %(w{len(params) - 1})s::jsonb")
        only = f" FILTER (WHERE {' AND '.join(conds)})" if conds else ""
        if op.field is None:
            aggregates.append(f"count(*){only} AS f{j}")
            continue
        col, got = x[op.field], f"jsonb_typeof({x[op.field]})"
        if op.type is int:  # another number is refused (bad) and may fail the cast
            value = f"CASE WHEN {got} = 'number' THEN {col}::numeric END"
        else:
            value = f"CASE WHEN {got} = 'string' THEN {col} #>> '{{}}' END"
        if op.kind == "count":
            aggregates.append(f"count({value}){only} AS f{j}")
        elif op.type is int:  # sum, min, max: past 64 bits fails the cast
            aggregates.append(f"({op.kind}({value}){only})::bigint AS f{j}")
        else:  # a text minimum or maximum, by code point as Python compares
            aggregates.append(f'{op.kind}({value} COLLATE "C"){only} AS f{j}')
    taken = ", ".join(f"data -> '{p}' AS {c}" for p, c in x.items())
    sql = (
        f"CREATE TEMPORARY TABLE {STAGED} ON COMMIT DROP AS SELECT "
        f"{x[decl.key]} #>> '{{}}' AS key, max(position) AS hi, count(*) AS n, "
        f"max(bad) AS bad, {', '.join(aggregates)} FROM (SELECT *, "
        f"({' OR '.join(bad)})::int AS bad FROM (SELECT position, data, metadata, {taken} "
        f"FROM {table} WHERE position > %(after)s AND position <= %(upto)s "
        "AND type = ANY(%(types)s) OFFSET 0) AS r OFFSET 0) AS c GROUP BY 1"
    )
    return sql, params
