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

``python benchmarks/run.py spark-keys [--backend sqlite|postgres] [--quick]``, or
``python -m benchmarks.bench_spark_keys [--backend ...] [--quick] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
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
    args = parser.parse_args()
    run(args.backend or ["sqlite", "postgres"], quick=args.quick, rounds=args.rounds)
