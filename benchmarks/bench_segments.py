"""Segments on the same cores: a Python-fold aggregation (``key="k"``) catching up on 300,000
events over 30,000 uniform keys in one process, with 1, 4 and 8 segments, against a plain
Python loop over the same SQLite file, in one run, alternating, each catch-up in a process of
its own. Targets (issue 31): 4 segments at least 0.3x the plain loop, and at least 0.8x of 1
segment. Every run's stored states are checked equal to the loop's.

``python benchmarks/run.py segments [--quick]``, or ``python -m benchmarks.bench_segments
[--quick] [--rounds N]`` (quick: 60,000 events over 6,000 keys).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import eventlanes as el

from .bench_scale import stored
from .bench_spark import fill, plain_fold
from .common import databases, in_child, print_table

EVENTS, KEYS = 300_000, 30_000
QUICK_EVENTS, QUICK_KEYS = 60_000, 6_000
SEGMENTS = (1, 4, 8)
ROUNDS = 3
TARGET_VS_LOOP, TARGET_VS_ONE = 0.3, 0.8


def _add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def define(app: el.App, name: str, segments: int) -> None:
    """The aggregation measured, with the library's defaults but its segments."""
    app.aggregation(name, key="k", initial=lambda: {"sum": 0, "n": 0},
                    segments=segments).on("Measured")(_add)  # fmt: skip


def _catch_up(conn: Any, url: str, name: str, segments: int) -> None:
    app = el.App(url)
    define(app, name, segments)
    app.store.head()  # connected: the pool's start is not timed
    start = time.perf_counter()
    app.start([name])
    app.wait_until_caught_up(3600, [name])
    seconds = time.perf_counter() - start
    app.stop()
    app.close()
    conn.send(seconds)


def _loop(conn: Any, url: str) -> None:
    start = time.perf_counter()
    totals = plain_fold(url)
    conn.send((time.perf_counter() - start, totals))


def run(backends: list[str] | None = None, quick: bool = False, rounds: int = ROUNDS) -> None:
    if backends is not None and "sqlite" not in backends:
        return  # the measure is on SQLite
    events, keys = (QUICK_EVENTS, QUICK_KEYS) if quick else (EVENTS, KEYS)
    seconds: dict[str, list[float]] = {"loop": [], **{f"{n}": [] for n in SEGMENTS}}
    with databases(["sqlite"]) as dbs:
        url = dbs["sqlite"]()
        fill(url, events, keys)
        want: dict[str, tuple[int, int]] | None = None
        for i in range(rounds):  # alternating: the machine's load changes
            took, totals = in_child(_loop, url)
            if want is None:
                want = totals
            seconds["loop"].append(took)
            for n in SEGMENTS:
                name = f"seg{n}-{i}"
                seconds[f"{n}"].append(in_child(_catch_up, url, name, n))
                if stored(url, name) != want:
                    raise AssertionError(f"{n} segments: states differ from a plain loop")
            rates = ", ".join(f"{k} {events / v[-1]:,.0f} ev/s" for k, v in seconds.items())
            print(f"round {i + 1}: {rates}", flush=True)
    rate = {k: events / statistics.median(v) for k, v in seconds.items()}
    rows: list[list[Any]] = [["plain Python loop", rate["loop"], "1.00x", "", ""]]
    for n in SEGMENTS:
        vs_loop, vs_one = rate[f"{n}"] / rate["loop"], rate[f"{n}"] / rate["1"]
        target = ""
        if n == 4:
            met = vs_loop >= TARGET_VS_LOOP and vs_one >= TARGET_VS_ONE
            target = f">= {TARGET_VS_LOOP}x, >= {TARGET_VS_ONE}x of 1: " + (
                "met" if met else "NOT MET"
            )
        rows.append([f"{n} segment{'s' if n > 1 else ''}", rate[f"{n}"], f"{vs_loop:.2f}x",
                     f"{vs_one:.2f}x", target])  # fmt: skip
    print_table(
        f"Python-fold aggregation catching up on {events:,} events over {keys:,} keys, SQLite "
        f"(median of {rounds} runs each, alternating, one process each; states checked equal "
        "to the loop's)",
        ["run", "events/s", "vs loop", "vs 1 segment", "target"],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    run(quick=args.quick, rounds=args.rounds)
