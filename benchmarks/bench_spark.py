"""Spark replay of 2,000,000 events / 50,000 keys with a per-key fold: local[1] and local[2]
against the local engine and a plain Python loop, in the same run; continuous mode: backlog
throughput and per-micro-batch latency."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import eventlanes as el

from .common import DATA, print_table

ROOT = Path(__file__).resolve().parent.parent
EVENTS, KEYS = 2_000_000, 50_000


def define(app: el.App, name: str = "totals") -> el.Aggregation:
    agg = app.aggregation(
        name, key="k", initial=lambda: {"sum": 0, "n": 0},
        segments=4, batch_size=5000, persist_every=2.0,
    )  # fmt: skip
    agg.on("Measured")(add)
    return agg


def add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def fill(url: str, events: int, keys: int) -> None:
    store = el.open_store(url)
    rng = random.Random(1)
    for i in range(events // 200):
        batch = [
            el.NewEvent("Measured", {"k": f"k{int(rng.paretovariate(0.8)) % keys}",
                                     "v": rng.randrange(100)})
            for _ in range(200)
        ]  # fmt: skip
        store.append(f"sensor-{i % 1000}", batch)
    store.close()


def _replay_in_subprocess(url: str, master: str) -> float:
    """Each master needs its own JVM: replay in a child process, return its events/s."""
    code = (
        "import sys, json; sys.path.insert(0, '.');"
        "import eventlanes as el; from eventlanes import spark as els;"
        "from benchmarks.bench_spark import define;"
        f"app = el.App({url!r}); define(app);"
        f"s = els.get_session({master!r}); r = els.replay(app, 'totals', spark=s);"
        "print(json.dumps({'events': r.events, 'seconds': r.seconds}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["events"] / result["seconds"]


def _plain_loop(url: str) -> float:
    store = el.open_store(url)
    start = time.perf_counter()
    totals: dict[str, list[int]] = {}
    n = 0
    for rows in store.scan(0, store.head(), chunk=50_000):
        for row in rows:
            data = json.loads(row[4])
            t = totals.setdefault(data["k"], [0, 0])
            t[0] += data["v"]
            t[1] += 1
            n += 1
    store.close()
    return n / (time.perf_counter() - start)


def _local_engine(url: str) -> float:
    app = el.App(url)
    define(app, "totals-local")  # its own tokens: the replay moved those of "totals"
    start = time.perf_counter()
    app.start()
    app.wait_until_caught_up(3600)
    app.stop()
    seconds = time.perf_counter() - start
    return app.store.count() / seconds


def _continuous(url: str) -> tuple[float, float, float]:
    """Backlog events/s, then the median and p90 seconds from append to state written."""
    from eventlanes.spark import get_session
    from eventlanes.spark.continuous import ContinuousAggregation

    app = el.App(url)
    define(app, "totals-stream")
    runner = ContinuousAggregation(app, "totals-stream", str(DATA / f"ckpt-{time.time()}"),
                                   spark=get_session("local[2]"), trigger_seconds=0.2,
                                   max_rows=100_000)  # fmt: skip
    head = app.store.head()
    start = time.perf_counter()
    runner.start()
    try:
        while min(s.position for s in app.status("totals-stream").segments) < head:
            time.sleep(0.1)
        backlog = head / (time.perf_counter() - start)
        latencies = []
        for i in range(10):
            t0 = time.perf_counter()
            [pos] = app.store.append("late", [el.NewEvent("Measured", {"k": f"late{i}", "v": 1})])
            while min(s.position for s in app.status("totals-stream").segments) < pos:
                time.sleep(0.01)
            latencies.append(time.perf_counter() - t0)
    finally:
        runner.stop()
    latencies.sort()
    return backlog, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.9)]


def run(backends: list[str], quick: bool = False) -> None:
    events = 200_000 if quick else EVENTS
    keys = 5_000 if quick else KEYS
    DATA.mkdir(exist_ok=True)
    db = DATA / "spark-bench.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    fill(url, events, keys)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    rows = []
    one = _replay_in_subprocess(url, "local[1]")
    two = _replay_in_subprocess(url, "local[2]")
    local = _local_engine(url)
    loop = _plain_loop(url)
    rows.append(["Spark replay local[1]", one, "1.0x"])
    rows.append(["Spark replay local[2]", two, f"{two / one:.2f}x local[1]"])
    rows.append(["local engine (1 process)", local, f"{two / local:.2f}x (Spark local[2] vs)"])
    rows.append(["plain Python loop over SQLite", loop, f"{two / loop:.2f}x (Spark local[2] vs)"])
    print_table(
        f"replay of {events:,} events / {keys:,} keys, per-key fold (events/s)",
        ["engine", "events/s", "ratio"], rows,
    )  # fmt: skip
    backlog, p50, p90 = _continuous(url)
    print_table(
        "Spark continuous aggregation (local[2], foreachBatch fold onto stored states)",
        ["backlog events/s", "append -> state p50 (s)", "p90 (s)"],
        [[backlog, f"{p50:.2f}", f"{p90:.2f}"]],
    )
