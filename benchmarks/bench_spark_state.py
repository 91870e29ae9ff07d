"""Spark's own stateful operator (``transformWithStateInPandas``, or ``transformWithState`` on
Rows) running the continuous per-key sum of ``bench_spark``, to set beside our ``foreachBatch``
runner (``eventlanes.spark.continuous.ContinuousAggregation``).

Per key the operator keeps {sum, n, position} in Spark's RocksDB state store; ``position`` is
the dedupe offset (the last position folded: rows at or below it are dropped, as the source
coordinates of our aggregations do for events without a source chain). The sink writes the
touched keys and the micro-batch id in one transaction and skips batch ids already written.

    .venv/bin/python -m benchmarks.bench_spark_state 200000 [--api pandas|row|both]

The first micro-batch of a fresh JVM pays for class loading, the RocksDB library and Python
workers; with ``--api both`` the second API runs in the warm JVM: for a fair pair, run each in
its own process (as ``bench_spark`` starts its continuous runner in a fresh session).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import eventlanes as el
from eventlanes.db import open_database

from .bench_spark import fresh_store, plain_fold
from .common import DATA, print_table

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
STATE_SCHEMA = "sum long, n long, position long"
OUTPUT_SCHEMA = "key string, sum long, n long, position long"


def _processor(api: str) -> Any:
    """The StatefulProcessor for ``api`` ("pandas": DataFrames in and out; "row": Rows)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.streaming.stateful_processor import TimerValues

    def fold(state: Any, positions: list[int], datas: list[str]) -> tuple[int, int, int]:
        total, n, last = (int(x) for x in state) if state is not None else (0, 0, 0)
        for position, data in sorted(zip(positions, datas, strict=True)):  # no order promised
            if position <= last:
                continue  # folded already (a micro-batch replayed after a crash)
            total += json.loads(data)["v"]
            n += 1
            last = position
        return total, n, last

    class Sum(StatefulProcessor):
        """Per key {sum, n, position} in one value state; subclasses read their input form."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.state = handle.getValueState("agg", STATE_SCHEMA)

        def close(self) -> None:
            pass

    class PandasSum(Sum):
        def handleInputRows(  # type: ignore[override]
            self, key: Any, rows: Iterator[Any], timerValues: TimerValues
        ) -> Iterator[Any]:
            import pandas as pd

            positions: list[int] = []
            datas: list[str] = []
            for pdf in rows:
                positions += pdf["position"].tolist()
                datas += pdf["data"].tolist()
            total, n, last = fold(self.state.get(), positions, datas)
            self.state.update((total, n, last))
            yield pd.DataFrame({"key": [key[0]], "sum": [total], "n": [n], "position": [last]})

    class RowSum(Sum):
        def handleInputRows(  # type: ignore[override]
            self, key: Any, rows: Iterator[Any], timerValues: TimerValues
        ) -> Iterator[Any]:
            positions: list[int] = []
            datas: list[str] = []
            for row in rows:
                positions.append(row.position)
                datas.append(row.data)
            total, n, last = fold(self.state.get(), positions, datas)
            self.state.update((total, n, last))
            yield Row(key=key[0], sum=total, n=n, position=last)

    return PandasSum() if api == "pandas" else RowSum()


@dataclass
class Sink:
    """``foreachBatch``: upsert the touched keys' states and the batch id in one transaction."""

    url: str
    query: str  # one benchmark run (its checkpoint): its own batch ids and states
    db: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.db = open_database(self.url)
        self.states, self.batches = self.db.table("tws_states"), self.db.table("tws_batches")
        self.db.run_ddl([
            f"CREATE TABLE IF NOT EXISTS {self.states} (query TEXT NOT NULL, key TEXT NOT NULL, "
            "sum BIGINT NOT NULL, n BIGINT NOT NULL, position BIGINT NOT NULL, "
            "PRIMARY KEY (query, key))",
            f"CREATE TABLE IF NOT EXISTS {self.batches} (query TEXT NOT NULL, "
            "batch_id BIGINT NOT NULL, end_position BIGINT NOT NULL, keys BIGINT NOT NULL, "
            "PRIMARY KEY (query, batch_id))",
        ])  # fmt: skip

    def __call__(self, batch: Any, batch_id: int) -> None:
        db = self.db
        done = db.sql(f"SELECT 1 FROM {self.batches} WHERE query = ? AND batch_id = ?")
        if db.query(done, (self.query, batch_id)):
            return  # Spark ran this micro-batch again after a restart: already written
        rows = [(self.query, r.key, r.sum, r.n, r.position) for r in batch.collect()]
        if not rows:
            return
        end = max(r[4] for r in rows)
        with db.transaction() as conn:
            conn.execute(
                db.sql(f"INSERT INTO {self.batches} (query, batch_id, end_position, keys) "
                       "VALUES (?, ?, ?, ?)"), (self.query, batch_id, end, len(rows)),
            )  # fmt: skip
            conn.executemany(
                db.sql(f"INSERT INTO {self.states} (query, key, sum, n, position) "
                       "VALUES (?, ?, ?, ?, ?) ON CONFLICT (query, key) DO UPDATE SET "
                       "sum = excluded.sum, n = excluded.n, position = excluded.position"),
                rows,
            )  # fmt: skip

    def reached(self) -> int:
        sql = f"SELECT MAX(end_position) FROM {self.batches} WHERE query = ?"
        return self.db.query(self.db.sql(sql), (self.query,))[0][0] or 0

    def micro_batches(self) -> int:
        sql = f"SELECT COUNT(*) FROM {self.batches} WHERE query = ?"
        return int(self.db.query(self.db.sql(sql), (self.query,))[0][0])

    def read(self) -> dict[str, dict[str, int]]:
        sql = f"SELECT key, sum, n, position FROM {self.states} WHERE query = ?"
        return {k: {"sum": s, "n": n, "position": p}
                for k, s, n, p in self.db.query(self.db.sql(sql), (self.query,))}  # fmt: skip


@dataclass
class Result:
    backlog_eps: float
    p50: float
    p90: float
    states: dict[str, dict[str, int]]
    events: int
    micro_batches: int  # written by the sink (empty micro-batches write nothing)
    backlog_seconds: float
    batch_ms: list[dict[str, int]]  # per micro-batch with input: Spark's durationMs


def _wait(sink: Sink, query: Any, position: int, poll: float, limit: float = 3600) -> None:
    deadline = time.perf_counter() + limit
    while sink.reached() < position:
        if query.exception() is not None:
            raise RuntimeError(f"streaming query failed: {query.exception()}")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"sink stuck at {sink.reached()} < {position}")
        time.sleep(poll)


def measure(
    url: str,
    checkpoint_dir: str,
    master: str = "local[2]",
    max_rows: int = 100_000,
    trigger_seconds: float = 0.2,
    api: str = "pandas",
) -> Result:
    from pyspark.sql import functions as F

    from eventlanes.spark import get_session

    if api not in ("pandas", "row"):
        raise ValueError(f"api must be 'pandas' or 'row', got {api!r}")
    spark = get_session(master)  # registers the "eventlanes" data source
    previous = spark.conf.get(PROVIDER, None)
    spark.conf.set(PROVIDER, ROCKSDB)  # a runtime SQL conf: read when the query starts
    sink = Sink(url, checkpoint_dir)
    store = el.open_store(url)
    head = store.head()
    query: Any = None
    try:
        start = time.perf_counter()
        events = (
            spark.readStream.format("eventlanes")
            .option("url", url)
            .option("partitions", str(spark.sparkContext.defaultParallelism))
            .option("max_rows", str(max_rows))
            .load()
            .where(F.col("type") == "Measured")
            .select("position", "data", F.get_json_object("data", "$.k").alias("key"))
        )
        grouped = events.groupBy("key")
        operator = (
            grouped.transformWithStateInPandas if api == "pandas" else grouped.transformWithState
        )
        states = operator(
            statefulProcessor=_processor(api),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Update",
            timeMode="None",
        )
        query = (
            states.writeStream.foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", checkpoint_dir)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .start()
        )
        _wait(sink, query, head, 0.1)
        backlog_seconds = time.perf_counter() - start
        latencies = []
        for i in range(10):
            t0 = time.perf_counter()
            [pos] = store.append("late", [el.NewEvent("Measured", {"k": f"late{i}", "v": 1})])
            _wait(sink, query, pos, 0.01, limit=600)
            latencies.append(time.perf_counter() - t0)
        batch_ms = [
            {"rows": p["numInputRows"], **p["durationMs"]}
            for p in query.recentProgress
            if p["numInputRows"]
        ]
    finally:
        if query is not None:
            query.stop()
        if previous is None:
            spark.conf.unset(PROVIDER)
        else:
            spark.conf.set(PROVIDER, previous)
        store.close()
    final = sink.read()
    expected = plain_fold(url)
    got = {k: (v["sum"], v["n"]) for k, v in final.items()}
    if got != expected:
        wrong = sorted(k for k in expected.keys() | got.keys() if got.get(k) != expected.get(k))
        raise AssertionError(
            f"{len(wrong)} keys differ from a plain fold, e.g. "
            + ", ".join(f"{k}: {got.get(k)} != {expected.get(k)}" for k in wrong[:5])
        )
    latencies.sort()
    return Result(
        backlog_eps=head / backlog_seconds,
        p50=latencies[len(latencies) // 2],
        p90=latencies[int(len(latencies) * 0.9)],
        states=final,
        events=head,
        micro_batches=sink.micro_batches(),
        backlog_seconds=backlog_seconds,
        batch_ms=batch_ms,
    )


def run_tws(
    url: str,
    checkpoint_dir: str,
    master: str = "local[2]",
    max_rows: int = 100_000,
    trigger_seconds: float = 0.2,
    *,
    api: str = "pandas",
) -> tuple[float, float, float, dict[str, dict[str, int]]]:
    """Backlog events/s, p50 and p90 seconds from append to state written, and the final states
    ({key: {sum, n, position}}), checked against a plain Python fold over the store."""
    r = measure(url, checkpoint_dir, master, max_rows, trigger_seconds, api)
    return r.backlog_eps, r.p50, r.p90, r.states


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", nargs="?", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--api", choices=["pandas", "row", "both"], default="pandas")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-rows", type=int, default=100_000)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    DATA.mkdir(exist_ok=True)
    url = fresh_store("spark-state-bench.db", args.events, args.keys)
    apis = ["pandas", "row"] if args.api == "both" else [args.api]
    rows = []
    for api in apis:
        checkpoint = str(DATA / f"ckpt-tws-{api}-{time.time()}")
        r = measure(url, checkpoint, args.master, args.max_rows, api=api)
        rows.append([api, r.events, r.micro_batches, r.backlog_eps, f"{r.backlog_seconds:.1f}",
                     f"{r.p50:.2f}", f"{r.p90:.2f}"])  # fmt: skip
        for b in r.batch_ms:
            print(f"  {api}: {b['rows']:>7,} rows: trigger {b.get('triggerExecution', 0):>6,} ms, "
                  f"addBatch {b.get('addBatch', 0):>6,} ms")  # fmt: skip
    print_table(
        f"transformWithState[InPandas] ({args.master}, {args.events:,} events / {args.keys:,} "
        f"keys, max_rows {args.max_rows:,}; sums checked)",
        ["api", "events", "batches", "backlog ev/s", "backlog s", "p50 s", "p90 s"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
