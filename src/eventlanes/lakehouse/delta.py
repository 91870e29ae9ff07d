"""An aggregation's states as a Delta Lake table, written by ``deltalake`` (delta-rs: Arrow in,
Parquet files and a transaction log out, no JVM), for Spark, DuckDB, Polars and Databricks.

The table has one row per state: ``aggregation`` (the aggregation, or one of its downstream
stages), ``key``, ``state`` (its JSON text, as the store keeps it), ``position`` (the end of the
write that last changed the row) and, for a declarative aggregation, one typed column per
field. A continuous run on Spark keeps it current (:meth:`DeltaStates.merge`): each
micro-batch's changed states are upserted, the batch's end in the same commit, before the
store's commit; a run that dies between the two is finished by the next batch, whose states
cover every row the lost one merged.

The commit protocol. One Delta commit replaces the table's rows with the states at position
``E`` and carries, as its application transactions, ``eventlanes/NAME/SEGMENT`` = ``E`` for
every segment: the table itself says which prefix of the log it holds, in the commit that
wrote the rows. It is written before the store's states and tokens move (downstream first):

* a crash before the commit leaves the table as it was (Parquet files that no commit names are
  never read; ``vacuum`` removes them);
* a crash after it, before the store moved, leaves the table at ``E`` and the tokens where
  they were: the next replay reaches ``E' >= E`` and, at ``E``, finds its write done and
  skips it (one commit per position), else replaces the rows;
* a table past the store's head (written from another store) is refused before any work.
"""

from __future__ import annotations

import io
import logging
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeltaWriteError, InvalidInputError
from ..processing.aggregating.declarative import Declaration

log = logging.getLogger("eventlanes.lakehouse")

#: columns every table has; a declarative aggregation's fields follow, one column each
FIXED = ("aggregation", "key", "state", "position")
#: a field that becomes a column (Delta tables without column mapping refuse many characters)
COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def app_id(name: str, segment: int) -> str:
    """The application transaction of ``name``'s segment: its version is the position."""
    return f"eventlanes/{name}/{segment}"


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise InvalidInputError(
            "writing a Delta table needs the deltalake package: pip install 'eventlanes[delta]'"
        ) from exc
    return deltalake


def _arrow_type(op: Any) -> Any:
    import pyarrow as pa

    if op.kind == "count":
        return pa.int64()
    return {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}[op.type]


@dataclass
class DeltaStates:
    """Where a replay of aggregation ``name`` writes its states: the Delta table at ``uri`` (a
    path, or ``s3://``, ``abfss://``, ``gs://`` with ``storage_options`` as deltalake takes
    them: credentials, endpoint)."""

    uri: str
    name: str
    declaration: Declaration | None = None
    storage_options: Mapping[str, str] | None = None
    fields: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        _deltalake()  # a missing package said before any work
        if not isinstance(self.uri, str) or not self.uri.strip():
            raise InvalidInputError(f"{self.name}: a Delta table's location must be a path or "
                                    f"URI, got {self.uri!r}")  # fmt: skip
        for out, op in (self.declaration.fields if self.declaration else {}).items():
            if not COLUMN.fullmatch(out) or out in FIXED:
                raise InvalidInputError(
                    f"{self.name}: field {out!r} cannot be a column of the Delta table (letters, "
                    f"digits and _, not one of {', '.join(FIXED)}): rename it"
                )
            self.fields[out] = _arrow_type(op)

    @property
    def options(self) -> dict[str, str] | None:
        """The storage options as deltalake takes them."""
        return dict(self.storage_options) if self.storage_options else None

    def schema(self) -> Any:
        """The table's Arrow schema: the fixed columns, then one per declared field."""
        import pyarrow as pa

        fixed = [pa.field(c, pa.string(), nullable=False) for c in FIXED[:3]]
        fixed.append(pa.field("position", pa.int64(), nullable=False))
        return pa.schema(fixed + [pa.field(n, t) for n, t in self.fields.items()])

    def positions(self, segments: Iterable[int]) -> dict[int, int | None]:
        """Each segment's position as the table's last commit for it says (None: no table,
        or none for that segment)."""
        deltalake = _deltalake()
        try:
            table = deltalake.DeltaTable(self.uri, storage_options=self.options)
        except deltalake.exceptions.TableNotFoundError:
            return dict.fromkeys(segments)
        return {s: table.transaction_version(app_id(self.name, s)) for s in segments}

    def check(self, segments: Iterable[int], head: int) -> dict[int, int | None]:
        """Before any work: a table past this store's head is another store's. The table's
        positions (:meth:`positions`) when it is not."""
        positions = self.positions(segments)
        ahead = {s: p for s, p in positions.items() if p is not None and p > head}
        if ahead:
            segment, position = min(ahead.items())
            raise DeltaWriteError(
                f"{self.name}: the Delta table {self.uri} holds segment {segment} at position "
                f"{position:,}, past this store's head {head:,} (a table written from another "
                "store?): nothing was written; give another location or remove that table"
            )
        return positions

    def write(self, rows: Iterable[list[tuple[str, str, str]]], segments: list[int], end: int,
              count: int) -> None:  # fmt: skip
        """Replace the table's rows by ``rows`` ((aggregation, key, state JSON) in bounded
        lists), committed with every segment's position ``end``, even when the table holds
        ``end`` already: a replay run again at the same position (its fold changed) replaces
        the store's states, and the table's must follow. ``count``: the states staged; the
        commit is made only when exactly that many rows were given."""
        self.check(segments, end)  # a table past this store's head: refused
        # deltalake pulls the batches from a thread of its own, and ``rows`` may read a
        # connection of this thread (SQLite's stage): they are read here and handed over
        # through a short queue, the write running on a thread of ours. Whatever stops the
        # reading is handed over too, so that the write fails and commits nothing.
        feed: queue.Queue[Any] = queue.Queue(maxsize=2)
        failed: list[BaseException] = []
        writer = threading.Thread(target=self._commit, args=(feed, segments, end, failed),
                                  name="eventlanes-delta", daemon=True)  # fmt: skip
        writer.start()
        try:
            written = 0
            for batch in self._batches(rows, end):
                self._hand(feed, batch, writer)
                written += batch.num_rows
            if written != count:
                raise DeltaWriteError(
                    f"{self.name}: {written:,} states were read back but {count:,} were staged; "
                    "nothing was written"
                )
            self._hand(feed, None, writer)
        except BaseException as exc:
            if writer.is_alive():
                feed.put(exc)  # the write fails with it: no commit
            writer.join()
            raise
        writer.join()
        if failed:
            raise DeltaWriteError(
                f"{self.name}: writing the Delta table {self.uri} failed: "
                f"{failed[0]}; the store was not changed"
            ) from failed[0]
        log.info("%s: %d states written to the Delta table %s at position %d",
                 self.name, count, self.uri, end)  # fmt: skip

    def merge(self, rows: list[tuple[str, str, str]], tokens: Mapping[int, int], end: int) -> bool:
        """Upsert ``rows`` (a micro-batch's changed states: (aggregation, key, state JSON)) on
        (aggregation, key), committed with every segment's position ``end``; False (nothing
        written) when the table already holds ``end``. The table must hold each segment at
        its store position ``tokens[segment]`` or past it within this batch (a run that died
        after its merge, before the store's commit: this batch's states cover every row that
        merge touched), else nothing is written: a table behind the store lacks the states of
        keys this batch does not change."""
        positions = self.follows(tokens, end)
        if all(p == end for p in positions.values()):
            log.info("%s: the Delta table %s already holds position %d: not merged again",
                     self.name, self.uri, end)  # fmt: skip
            return False
        deltalake = _deltalake()
        import pyarrow as pa

        batches = list(self._batches([rows], end)) if rows else []
        source = pa.Table.from_batches(batches, schema=self.schema())
        table = deltalake.DeltaTable(self.uri, storage_options=self.options)
        merger = table.merge(
            source,
            predicate="t.aggregation = s.aggregation AND t.key = s.key",
            source_alias="s",
            target_alias="t",
            commit_properties=self._commit_properties(list(tokens), end),
        )
        merger.when_matched_update_all().when_not_matched_insert_all().execute()
        return True

    def follows(self, tokens: Mapping[int, int], end: int) -> dict[int, int | None]:
        """The table's positions, when it may follow the store from ``tokens`` (segment ->
        the store's position) up to ``end``: each at least the store's, at most ``end``."""
        positions = self.positions(tokens)
        for segment, at in sorted(tokens.items()):
            held = positions[segment]
            if held is None or not at <= held <= end:
                shown = "no position" if held is None else f"position {held:,}"
                raise DeltaWriteError(
                    f"{self.name}: the Delta table {self.uri} holds {shown} for segment "
                    f"{segment}, and the store {at:,}: replay {self.name} with this table "
                    "first (--delta) so that they start equal; nothing was written"
                )
        return positions

    def _commit_properties(self, segments: list[int], end: int) -> Any:
        deltalake = _deltalake()
        return deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id(self.name, s), end) for s in segments],
            custom_metadata={"eventlanes.aggregation": self.name, "eventlanes.position": str(end)},
        )

    @staticmethod
    def _hand(feed: queue.Queue[Any], item: Any, writer: threading.Thread) -> None:
        while True:
            try:
                feed.put(item, timeout=0.2)
                return
            except queue.Full:
                if not writer.is_alive():  # it failed: its error is reported by write()
                    return

    def _commit(self, feed: queue.Queue[Any], segments: list[int], end: int,
                failed: list[BaseException]) -> None:  # fmt: skip
        import pyarrow as pa

        deltalake = _deltalake()

        def batches() -> Iterator[Any]:
            while (item := feed.get()) is not None:
                if isinstance(item, BaseException):
                    raise DeltaWriteError(f"{self.name}: the states' reading stopped: {item!r}")
                yield item

        commit = self._commit_properties(segments, end)
        try:
            reader = pa.RecordBatchReader.from_batches(self.schema(), batches())
            deltalake.write_deltalake(
                self.uri,
                reader,
                mode="overwrite",
                schema_mode="overwrite",
                storage_options=self.options,
                commit_properties=commit,
            )
        except BaseException as exc:  # noqa: BLE001 - reported by write(), on its thread
            failed.append(exc)

    def _batches(self, rows: Iterable[list[tuple[str, str, str]]], end: int) -> Iterator[Any]:
        import pyarrow as pa

        schema = self.schema()
        for chunk in rows:
            names, keys, states = (list(c) for c in zip(*chunk, strict=True))
            columns = [
                pa.array(names, pa.string()),
                pa.array(keys, pa.string()),
                pa.array(states, pa.string()),
                pa.array([end] * len(chunk), pa.int64()),
            ]
            if self.fields:
                typed = self._typed(states, keys)
                columns += [typed.column(n).combine_chunks() for n in self.fields]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    def _typed(self, states: list[str], keys: list[str]) -> Any:
        """The fields of the states' JSON texts as typed columns (parsed by Arrow, in C++)."""
        import pyarrow as pa
        from pyarrow import json as pajson

        schema = pa.schema(list(self.fields.items()))
        text = "\n".join(states).encode()
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        try:
            table = pajson.read_json(
                io.BytesIO(text),
                parse_options=options,
                read_options=pajson.ReadOptions(block_size=len(text) + 1),
            )
        except pa.ArrowInvalid as exc:
            raise DeltaWriteError(
                f"{self.name}: a state (keys {keys[0]!r} to {keys[-1]!r}) does not fit the "
                f"Delta table's typed columns: {exc}; nothing was written"
            ) from exc
        if table.num_rows != len(states):
            raise DeltaWriteError(f"{self.name}: {table.num_rows} typed rows for {len(states)} "
                                  "states; nothing was written")  # fmt: skip
        return table
