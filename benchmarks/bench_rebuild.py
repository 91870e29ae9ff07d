"""Rebuilds at the speed of the store (Arrow reads): each figure beside its baseline, measured
in turns in one run (the machine is shared: ratios of neighbouring runs, repeated, with their
spread), on SQLite and on PostgreSQL, 2,000,000 events over 50,000 keys (``--quick``: 200,000
over 5,000). Every engine's states are checked equal to a plain Python loop's.

* Spark replay of a declarative aggregation (sum and count per key), local[2], warm: from the
  store against the same replay from a Parquet export of it (target >= 0.6x).
* Spark replay of the same sums with a Python fold, from the store, against the plain Python
  loop over the store (target >= 1.0x).
* Parquet export against a raw Arrow read of the same rows with the same library (ADBC or
  Python's SQLite; target >= 0.7x); and what the read itself gives over the row scan.
* The local engine catching up on a declarative aggregation (one process, from scratch) with
  the Arrow fold (PostgreSQL) or SQLite's pushdown, against the row path (``pushdown=False``,
  what PostgreSQL ran before; target >= 2x on PostgreSQL).

``python benchmarks/run.py rebuild [--backend sqlite|postgres] [--quick]``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import eventlanes as el

from .bench_aggregation import states
from .bench_spark import fill, plain_fold
from .common import DATA, databases, print_table

ROOT = Path(__file__).resolve().parent.parent
EVENTS, KEYS = 2_000_000, 50_000
ROUNDS = 3


def define(app: el.App) -> None:
    """The declarative aggregation and the same sums by a Python fold (Spark replays)."""
    app.aggregation("declared", key="k", on="Measured",
                    fields={"sum": el.sum("v"), "n": el.count()}, segments=4)  # fmt: skip
    app.aggregation("fold", key="k", initial=lambda: {"sum": 0, "n": 0},
                    segments=4).on("Measured")(add)  # fmt: skip


def add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# -- Spark (in a child process: one JVM for all its replays) ---------------------------------
def spark_child(url: str, parquet: str, rounds: int) -> dict[str, list[float]]:
    """Replays in turns on one local[2] session after a warm-up of each: declarative from
    the store and from the export, the Python fold from the store, the plain loop."""
    from eventlanes import spark as els

    app = el.App(url)
    define(app)
    want = plain_fold(url)
    session = els.get_session("local[2]")
    for name, pq in [("declared", None), ("declared", parquet), ("fold", None)]:
        els.replay(app, name, spark=session, parquet=pq)  # warm-up (JIT, code generation)
    out: dict[str, list[float]] = {"store": [], "parquet": [], "fold": [], "loop": []}
    for _ in range(rounds):
        for key, name, pq in [("store", "declared", None), ("parquet", "declared", parquet),
                              ("fold", "fold", None)]:  # fmt: skip
            result = els.replay(app, name, spark=session, parquet=pq)
            out[key].append(result.events / result.seconds)
            if states(app, name) != want:
                raise AssertionError(f"Spark replay {key}: states differ from a plain loop")
        seconds, totals = _timed(lambda: plain_fold(url))
        if totals != want:
            raise AssertionError("plain loop differs from itself")
        out["loop"].append(sum(n for _, n in want.values()) / seconds)
    session.stop()
    return out


def _spark(url: str, parquet: str, rounds: int) -> dict[str, list[float]]:
    code = (
        "import sys, json; sys.path.insert(0, '.');"
        "from benchmarks.bench_rebuild import spark_child;"
        f"print(json.dumps(spark_child({url!r}, {parquet!r}, {rounds})))"
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=env)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"Spark replays failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- export against the raw read -------------------------------------------------------------
def raw_arrow(store: el.EventStore, head: int) -> int:
    """The rows read into Arrow by the backend's library alone, as a program using it directly
    would: PostgreSQL's ADBC driver; Python's own SQLite (a second SQLite library in the
    process would drop the store's POSIX locks), its columns converted by pyarrow."""
    import sqlite3

    import pyarrow as pa

    from eventlanes.store import arrow

    columns = "position, stream_id, version, type, data, metadata, recorded_at, routing_hash"
    sql = f"SELECT {columns} FROM {store.events_table} WHERE position <= {head} ORDER BY position"
    if store.db.backend == "sqlite":
        conn = sqlite3.connect(store.db.read_only_uri(), uri=True)  # type: ignore[attr-defined]
        try:
            cur, n = conn.execute(sql), 0
            while rows := cur.fetchmany(65_536):
                n += pa.RecordBatch.from_arrays([pa.array(c) for c in zip(*rows, strict=True)],
                                                names=columns.split(", ")).num_rows  # fmt: skip
            return n
        finally:
            conn.close()
    module = arrow.driver("postgresql")
    with module.connect(store.db.url.target, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return sum(b.num_rows for b in cur.fetch_record_batch())


def row_scan(store: el.EventStore, head: int) -> int:
    return sum(len(rows) for rows in store.scan(0, head, chunk=20_000))


def sqlite3_scan(path: str, head: int) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sql = "SELECT * FROM el_events WHERE position <= ? ORDER BY position"
    rows = sum(1 for _ in conn.execute(sql, (head,)))
    conn.close()
    return rows


def export_rounds(url: str, rounds: int) -> dict[str, list[float]]:
    store = el.open_store(url, create=False)
    head = store.head()
    directory = str(DATA / f"export-{uuid.uuid4().hex[:6]}")
    out: dict[str, list[float]] = {"export": [], "raw": [], "scan_arrow": [], "rows": []}
    path = getattr(store.db, "path", None)
    if path is not None:
        out["sqlite3"] = []
    for _ in range(rounds):
        seconds, end = _timed(lambda: el.spark.export_parquet(store, directory))
        assert end == head
        out["export"].append(head / seconds)
        seconds, read = _timed(lambda: raw_arrow(store, head))
        out["raw"].append(read / seconds)
        seconds, read = _timed(lambda: sum(b.num_rows for b in store.scan_arrow(0, head)))
        out["scan_arrow"].append(read / seconds)
        seconds, read = _timed(lambda: row_scan(store, head))
        out["rows"].append(read / seconds)
        if path is not None:
            seconds, read = _timed(lambda: sqlite3_scan(path, head))
            out["sqlite3"].append(read / seconds)
    manifest = json.loads((Path(directory) / "_eventlanes.json").read_text())
    if manifest["events"] != store.count() or manifest["columns"] != {"k": "string", "v": "long"}:
        raise AssertionError(f"export: unexpected manifest {manifest}")
    store.close()
    shutil.rmtree(directory, ignore_errors=True)
    return out


# -- the local engine catching up ------------------------------------------------------------
def local_rounds(url: str, rounds: int) -> dict[str, list[float]]:
    want = plain_fold(url)
    out: dict[str, list[float]] = {"pushdown": [], "rows": []}
    for _ in range(rounds):
        for key, pushdown in [("pushdown", True), ("rows", False)]:
            app = el.App(url)
            name = f"agg_{uuid.uuid4().hex[:8]}"  # from scratch: tokens and states of its own
            app.aggregation(name, key="k", on="Measured", segments=1, batch_size=5000,
                            fields={"sum": el.sum("v"), "n": el.count()},
                            pushdown=pushdown)  # fmt: skip
            start = time.perf_counter()
            app.start([name])
            app.wait_until_caught_up(3600, [name])
            seconds = time.perf_counter() - start
            app.stop()
            if states(app, name) != want:
                raise AssertionError(f"local engine ({key}): states differ from a plain loop")
            out[key].append(app.store.count() / seconds)
            app.close()
    return out


def run(backends: list[str], quick: bool = False) -> None:
    events = 200_000 if quick else EVENTS
    keys = 5_000 if quick else KEYS
    rounds = 2 if quick else ROUNDS
    rows: list[list[Any]] = []
    with databases(backends) as dbs:
        for backend, make in dbs.items():
            url = make()
            start = time.perf_counter()
            fill(url, events, keys)
            print(f"{backend}: {events:,} events in {time.perf_counter() - start:.0f} s")
            ex = export_rounds(url, rounds)
            parquet = str(DATA / f"replay-{backend}")
            el.spark.export_parquet(el.open_store(url, create=False), parquet)
            sp = _spark(url, parquet, rounds)
            lo = local_rounds(url, rounds)
            med = statistics.median

            def pairs(a: str, b: str, src: dict[str, list[float]]) -> str:
                return spread([x / y for x, y in zip(src[a], src[b], strict=True)])

            rows += [
                [backend, "Spark replay, declarative, from the store, local[2], warm",
                 med(sp["store"]), "from a Parquet export", med(sp["parquet"]),
                 pairs("store", "parquet", sp), ">= 0.6x"],
                [backend, "Spark replay, Python fold, from the store, local[2], warm",
                 med(sp["fold"]), "plain Python loop over the store", med(sp["loop"]),
                 pairs("fold", "loop", sp), ">= 1.0x"],
                [backend, "Parquet export", med(ex["export"]),
                 "raw ADBC read of the same rows", med(ex["raw"]),
                 pairs("export", "raw", ex), ">= 0.7x"],
                [backend, "scan_arrow (ADBC, checked UTF-8)", med(ex["scan_arrow"]),
                 "scan (rows, as Spark read before)", med(ex["rows"]),
                 pairs("scan_arrow", "rows", ex), ""],
                [backend, "local engine, declarative, catching up (1 process)",
                 med(lo["pushdown"]), "the same by rows (pushdown=False)", med(lo["rows"]),
                 pairs("pushdown", "rows", lo), ">= 2x" if backend == "postgres" else ""],
            ]  # fmt: skip
            if "sqlite3" in ex:
                rows.append([backend, "plain sqlite3 scan of every column", med(ex["sqlite3"]),
                             "raw ADBC read", med(ex["raw"]), pairs("sqlite3", "raw", ex),
                             ""])  # fmt: skip
            shutil.rmtree(parquet, ignore_errors=True)
            print(json.dumps({"backend": backend, "spark": sp, "export": ex, "local": lo}))
    print_table(
        f"rebuilds from the store: {events:,} events over {keys:,} keys, events/s "
        f"(medians of {rounds} rounds taken in turns; ratio: median of the rounds' ratios, "
        "their range in brackets)",
        ["store", "path", "now", "baseline", "baseline events/s", "ratio", "target"],
        rows,
    )


if __name__ == "__main__":
    run(["sqlite", "postgres"], quick="--quick" in sys.argv)
