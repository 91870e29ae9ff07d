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

import logging
from collections.abc import Callable
from typing import Any

from ....store.postgres import PostgresEventStore
from ....upcasting import Upcasters
from ....upcasting.arrow import upcast_batch
from ..declarative import Declaration
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

    # -- merging in place (the worker's thread) -----------------------------------------------
    def merge_in_place(
        self, name: str, pending: Pending | Folded, store_token: Callable[[Any], None]
    ) -> int | None:
        """The range's groups (``pending``: a :class:`~.base.Folded` read by the reader)
        copied into a temporary table, then merged into the states by one statement, and
        ``store_token(conn)``, in one transaction: the events merged, or None when nothing
        was written (a stored state the merge in memory would not take as it is fails the
        statement: a sum past 64 bits, a field of another type, offsets at or past the range;
        or the role may not create temporary tables)."""
        assert self._place is not None and isinstance(pending, Folded)
        import psycopg  # here: executors import this module, and may have no psycopg

        create, copy_in, upsert = self._place
        db = self.store.db
        outs = range(4, 4 + len(self.fields))
        try:
            with db.transaction() as conn:
                try:
                    with conn.transaction():  # a savepoint: its failure leaves the rest
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
        return pending.events

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
