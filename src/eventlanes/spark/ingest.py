"""A replay's states written by the executors where they are folded (PostgreSQL).

Each task appends its partition's states to the replay's unlogged stage
(:mod:`eventlanes.processing.tables.staging`) with the ADBC driver's binary COPY, no Python
object per state, in one transaction that first deletes what an earlier attempt of the same
task (of the same job of the replay) wrote, under a lock per task: a retried or speculative
attempt replaces, never adds to, the partition's states. The tasks report what they staged;
the driver checks the stage holds exactly that before anything moves into the states.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from functools import partial
from typing import Any

#: what each task reports: the rows its plan read (a declarative plan's ``rows``), the states
#: it staged
REPORT = "read long, staged long"
STAGED = ("aggregation", "key", "value", "offsets", "dropped", "dropped_by", "job", "task")


def ingest(df: Any, url: str, table: str, name: str, rows: bool, job: int) -> tuple[int, int]:
    """Stage ``df``'s states (kind "state" rows of a fold's output, or a declarative plan's
    rows when ``rows``: then of aggregation ``name``) from the executors into ``table`` on the
    store at ``url``, as the replay's ``job``-th job (its tasks' rows are told apart from other
    jobs'): (rows read, states staged), summed over the tasks that succeeded."""
    if not rows:
        df = df.where(df.kind == "state").select("name", *STAGED[1:-2])
    report = df.mapInArrow(partial(_task, url, table, name, rows, job), REPORT).toArrow()
    return sum(report.column("read").to_pylist()), sum(report.column("staged").to_pylist())


def _task(
    url: str, table: str, name: str, rows: bool, job: int, batches: Iterator[Any]
) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    from ..db.url import parse_url
    from ..store.arrow import driver

    context = TaskContext.get()
    assert context is not None  # on an executor, in a task
    task = context.partitionId()
    schema = pa.schema([("aggregation", pa.string()), ("key", pa.string()),
                        ("value", pa.string()), ("offsets", pa.string()),
                        ("dropped", pa.int64()), ("dropped_by", pa.string()),
                        ("job", pa.int32()), ("task", pa.int32())])  # fmt: skip
    counts = {"read": 0, "staged": 0}

    def staged() -> Iterator[Any]:
        for batch in batches:
            if rows:
                counts["read"] += pc.sum(batch.column("rows")).as_py() or 0
                batch = batch.filter(pc.is_valid(batch.column("key")))
                named = pa.array([name] * batch.num_rows, pa.string())
            else:
                named = batch.column("name")
            n = batch.num_rows
            columns = [batch.column(c).cast(schema.field(c).type) for c in STAGED[1:-2]]
            counts["staged"] += n
            ids = [pa.array([job] * n, pa.int32()), pa.array([task] * n, pa.int32())]
            yield pa.record_batch([named, *columns, *ids], schema=schema)

    lock = zlib.crc32(table.encode()) - 2**31
    postgres = driver("postgresql")
    with postgres.connect(parse_url(url).target, autocommit=False) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock({int(lock)}, {int(job) << 20 | int(task)})")
        cur.fetchall()
        cur.execute(f"DELETE FROM {table} WHERE job = {int(job)} AND task = {int(task)}")
        cur.adbc_ingest(table, pa.RecordBatchReader.from_batches(schema, staged()), mode="append")
        conn.commit()
    yield pa.record_batch([pa.array([counts["read"]]), pa.array([counts["staged"]])],
                          names=["read", "staged"])  # fmt: skip
