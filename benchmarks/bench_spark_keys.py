"""Many keys on a Spark replay: the declarative aggregation of ``bench_scale`` replayed on
``local[2]`` from a store of 2,000,000 events over 20,000 and over 1,000,000 uniform keys
(``--quick``: 200,000 events, 2,000 and 100,000 keys), alternating, each replay in a driver
process of its own after one warm-up replay there (the JVM's classes, Python workers). The
measured replay replaces the warm-up's states, as a rebuild does.

Per replay: events/s; the driver's Python RSS growth (its peak during the replay over its
size before, the kernel's high-water mark reset first); the replay's one write transaction
(the staged states moved in with the tokens: what a heartbeat or a writer may wait on).
Targets (issue 32): many keys at least 0.6x the events/s of few; RSS growth under 50 MB.
Every replay's states are checked equal to a plain Python loop's.

``--scale``: the same replay, once per point, from 2,000,000 events over 20,000 keys up to
10,000,000 events over 5,000,000 keys (SQLite), each in a fresh driver process (its JVM start
not timed; ``spark.driver.memory=4g``): the replay's time, the driver's peak Python RSS and
the peak RSS of the whole process tree (driver, JVM, Python workers; sampled every 0.2 s), and
the slopes: seconds per million events at few keys, per million keys at 10,000,000 events.

``python benchmarks/run.py spark-keys [--backend sqlite|postgres] [--quick]``, or
``python -m benchmarks.bench_spark_keys [--backend ...] [--quick] [--rounds N] [--scale]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import eventlanes as el

from .bench_scale import define, stored, stores
from .bench_spark import fill, plain_fold
from .common import in_child, memory, print_table

EVENTS, KEYS = 2_000_000, (20_000, 1_000_000)
QUICK_EVENTS, QUICK_KEYS = 200_000, (2_000, 100_000)
ROUNDS = 2
TARGET, RSS_TARGET = 0.6, 50 << 20


def _child_main(conn: Any, url: str, name: str) -> None:
    from eventlanes.processing.tables.staging import StagedStates
    from eventlanes.spark import get_session

    moves: list[float] = []
    move = StagedStates.replace

    def timed(self: StagedStates, *args: Any) -> None:  # the one write transaction, timed
        start = time.perf_counter()
        move(self, *args)
        moves.append(time.perf_counter() - start)

    StagedStates.replace = timed  # type: ignore[method-assign]
    spark = get_session("local[2]")
    app = el.App(url)
    define(app, name)
    el.spark.replay(app, name, spark=spark)  # warm-up
    with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark starts again
        refs.write("5")
    before = memory()["VmRSS"]
    start = time.perf_counter()
    result = el.spark.replay(app, name, spark=spark)
    seconds = time.perf_counter() - start
    conn.send((seconds, result.events, memory()["VmHWM"] - before, moves[-1]))
    app.close()
    spark.stop()


def _measure(backend: str, events: int, sizes: tuple[int, ...], rounds: int) -> list[list[Any]]:
    runs: dict[int, list[tuple[float, int, int, float]]] = {k: [] for k in sizes}
    with stores(backend) as new_url:
        urls = {keys: new_url() for keys in sizes}
        wants = {}
        for keys, url in urls.items():
            fill(url, events, keys)
            wants[keys] = plain_fold(url)
        for i in range(rounds):  # alternating: the machine's load changes
            for keys, url in urls.items():
                got = in_child(_child_main, url, "spark-keys")
                if got[1] != events:
                    raise AssertionError(f"{backend}: read {got[1]} events, not {events}")
                if stored(url, "spark-keys") != wants[keys]:
                    raise AssertionError(f"{backend} {keys:,} keys: states differ from a loop")
                runs[keys].append(got)
                print(f"{backend} {keys:,} keys, run {i + 1}: {events / got[0]:,.0f} ev/s, "
                      f"+{got[2] / 2**20:,.0f} MB, move {got[3]:.2f} s", flush=True)  # fmt: skip
    few = statistics.median(events / r[0] for r in runs[sizes[0]])
    rows = []
    for keys in sizes:
        rate = statistics.median(events / r[0] for r in runs[keys])
        grown = statistics.median(r[2] for r in runs[keys])
        moved = statistics.median(r[3] for r in runs[keys])
        many = keys == sizes[-1]
        met = rate / few >= TARGET and grown < RSS_TARGET
        rows.append([backend, f"{keys:,}", rate, f"{rate / few:.2f}x",
                     f"+{grown / 2**20:,.0f} MB", f"{moved:.2f}",
                     f">= {TARGET}x, < +50 MB" if many else "",
                     ("met" if met else "NOT MET") if many else ""])  # fmt: skip
    return rows


#: (events, keys) of the scale table
SCALE = ((2_000_000, 20_000), (10_000_000, 20_000), (5_000_000, 2_500_000),
         (10_000_000, 5_000_000))  # fmt: skip
QUICK_SCALE = ((200_000, 2_000), (1_000_000, 2_000), (1_000_000, 500_000))


def _tree_rss(proc: Any) -> int:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except Exception:  # noqa: BLE001 - a Python worker that just ended
            pass
    return total


def _scale_child(conn: Any, url: str, name: str) -> None:
    import threading

    import psutil

    from eventlanes.spark import get_session

    me, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], _tree_rss(me))

    # Spark's default 1 GB fails at 5,000,000 keys (its hash aggregation cannot spill: the
    # replay's error says to raise this setting)
    spark = get_session("local[2]", conf={"spark.driver.memory": "4g"})
    app = el.App(url)
    define(app, name)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    result = el.spark.replay(app, name, spark=spark)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    conn.send((seconds, result.events, memory()["VmHWM"], peak[0]))
    app.close()
    spark.stop()


def scale(quick: bool = False) -> None:
    """The scale table (SQLite): one replay per point, each checked against a plain loop."""
    points = QUICK_SCALE if quick else SCALE
    got: dict[tuple[int, int], tuple[float, int, int, int]] = {}
    with stores("sqlite") as new_url:
        for events, keys in points:
            url = new_url()
            fill(url, events, keys)
            want = plain_fold(url)
            got[(events, keys)] = r = in_child(_scale_child, url, "spark-keys")
            if r[1] != events or stored(url, "spark-keys") != want:
                raise AssertionError(f"{events:,} events over {keys:,} keys: not what a loop "
                                     "folds")  # fmt: skip
            print(f"{events:,} events, {keys:,} keys: {r[0]:.1f} s, driver {r[2] >> 20} MB, "
                  f"tree {r[3] >> 20} MB", flush=True)  # fmt: skip
            Path(url.removeprefix("sqlite:///")).unlink()  # 10M events: a few GB of disk
    rows = [[f"{e:,}", f"{k:,}", f"{r[0]:.1f}", f"{e / r[0]:,.0f}", f"{r[2] >> 20} MB",
             f"{r[3] >> 20} MB"] for (e, k), r in got.items()]  # fmt: skip
    print_table(
        "Spark replay (local[2], spark.driver.memory=4g, SQLite) at scale: one replay per point "
        "in a fresh driver (states checked equal to a plain loop)",
        ["events", "keys", "replay s", "events/s", "driver peak RSS", "tree peak RSS"],
        rows,
    )
    (e0, k0), (e1, _), *_, (e3, k3) = points
    per_event = (got[(e1, k0)][0] - got[(e0, k0)][0]) / ((e1 - e0) / 1e6)
    per_key = (got[(e3, k3)][0] - got[(e1, k0)][0]) / ((k3 - k0) / 1e6)
    tree_per_key = (got[(e3, k3)][3] - got[(e1, k0)][3]) / ((k3 - k0) / 1e6) / 2**20
    print(
        f"slope: {per_event:.2f} s per million events (at {k0:,} keys); {per_key:.2f} s and "
        f"{tree_per_key:+,.0f} MB of tree peak per million keys more (at {e1:,} events)"
    )


def run(backends: list[str], quick: bool = False, rounds: int = ROUNDS) -> None:
    events = QUICK_EVENTS if quick else EVENTS
    sizes = QUICK_KEYS if quick else KEYS
    rows = [row for backend in backends for row in _measure(backend, events, sizes, rounds)]
    print_table(
        f"Spark replay (local[2]) of a declarative aggregation, {events:,} events (median of "
        f"{rounds} runs each, alternating; states checked equal to a plain loop)",
        ["backend", "keys", "events/s", "vs fewest keys", "driver RSS growth", "write txn s",
         "target", ""],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--scale", action="store_true", help="the scale table (SQLite)")
    args = parser.parse_args()
    if args.scale:
        scale(quick=args.quick)
    else:
        run(args.backend or ["sqlite", "postgres"], quick=args.quick, rounds=args.rounds)
