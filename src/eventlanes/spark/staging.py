"""Where a Spark replay's states go before they move in with the tokens
(:class:`~eventlanes.processing.tables.staging.StagedStates`), so that the driver's memory
does not grow with the number of keys: written by the executors where the store is
PostgreSQL (:mod:`.ingest`), else brought to the driver a bounded part at a time. For the
parts, the states are kept on the executors (memory, then disk), counted, and collected one
hash bucket of the key at a time, each part staged before the next is asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import repeat
from typing import Any

from ..errors import SparkJobError
from ..processing.tables.staging import StagedStates
from .ingest import ingest

log = logging.getLogger("eventlanes.spark")

#: states collected at a time, at most about (their Arrow columns, then one Python tuple each)
PART = 100_000


def parts_of(df: Any, bound: int, what: str) -> Iterator[Any]:
    """``df``'s rows as Arrow tables of about :data:`PART` rows at most (one collect when
    ``bound``, a bound of its row count, says it is small). Every row is in exactly one part:
    the parts' sizes are checked against the count, or :class:`SparkJobError` (``what`` names
    the replay)."""
    if bound <= PART:
        yield df.toArrow()
        return
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    kept = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        total = kept.count()
        parts = max(1, -(-total // PART))
        if parts == 1:
            yield kept.toArrow()
            return
        bucket = F.pmod(F.xxhash64(F.col("key")), F.lit(parts))  # a null key's: the seed's
        seen = 0
        for i in range(parts):
            table = kept.where(bucket == i).toArrow()
            seen += table.num_rows
            yield table
            log.info("%s: %d of %d parts of the states staged (%d states)", what, i + 1, parts,
                     seen)  # fmt: skip
        if seen != total:  # a part lost or doubled: nothing may be written
            raise SparkJobError(
                f"{what}: Spark returned {seen:,} states in parts but counted {total:,}: "
                "nothing was written"
            )
    finally:
        kept.unpersist()


#: the staged columns after (aggregation) name, as the plans name them
STAGED_COLUMNS = ("key", "value", "offsets", "dropped", "dropped_by")
SLICE = 20_000  # states staged per transaction by the driver


class Staging:
    """Where a replay's states go before they move in: written by the executors when the
    store is PostgreSQL and they read it (``url``, checked by the preflight), else brought to
    the driver a bounded part at a time (``bound``: at most this many states)."""

    def __init__(self, stage: StagedStates, name: str, bound: int, url: str | None) -> None:
        self.stage, self.name, self.bound = stage, name, bound
        self.on_executors = stage.shared and url is not None  # executors see the stage
        self.url = url or ""
        self.staged = 0
        self.jobs = 0  # the executors' jobs so far

    def _job(self) -> int:
        self.jobs += 1
        return self.jobs

    def declared(self, plan: Any) -> int:
        """Stage a declarative plan's rows; the rows it read (of every type)."""
        from .declarative import field_errors

        with field_errors():
            if self.on_executors:
                job = self._job()
                read, staged = ingest(plan, self.url, self.stage.stage, self.name, True, job)
                self.staged += staged
                return read
            return self._parts(parts_of(plan, self.bound, self.name), rows=True)

    def states(self, folded: Any) -> None:
        """Stage the states (rows of kind "state") of a fold's output."""
        if self.on_executors:
            job = self._job()
            self.staged += ingest(folded, self.url, self.stage.stage, self.name, False, job)[1]
            return
        states = folded.where(folded.kind == "state").select("name", *STAGED_COLUMNS)
        self._parts(parts_of(states, self.bound, self.name), rows=False)

    def clear(self) -> None:
        self.stage.clear()
        self.staged = 0

    def check(self) -> None:
        """Nothing moves unless the stage holds exactly the states the plans returned."""
        found = self.stage.count()
        if found != self.staged:
            raise SparkJobError(
                f"{self.name}: {found:,} states were staged but Spark returned {self.staged:,}: "
                "nothing was written"
            )

    def _parts(self, parts: Iterator[Any], rows: bool) -> int:
        """Stage Arrow parts (a declarative plan's rows when ``rows``: of aggregation
        ``name``, a null key's row no state); the ``rows`` column's sum, or 0."""
        import pyarrow.compute as pc

        read = 0
        for part in parts:
            if rows:
                read += pc.sum(part.column("rows")).as_py() or 0
                part = part.filter(pc.is_valid(part.column("key")))
            # Python rows a slice at a time: their objects, not the Arrow part's, are the bulk
            for i in range(0, part.num_rows, SLICE):
                piece = part.slice(i, SLICE)
                named = repeat(self.name) if rows else piece.column("name").to_pylist()
                columns = [piece.column(c).to_pylist() for c in STAGED_COLUMNS]
                self.stage.add(list(zip(named, *columns, strict=False)))
                self.staged += piece.num_rows
        return read
