"""CommitTracker: acknowledgements per second (dispatch + done + committable per event) with
completions in order and in random order within the window, one call per event and in batches,
plus the tracker's peak traced memory. No database: ``backends`` is ignored."""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable

from eventlanes.processing.executors.acks import CommitTracker

from .common import print_table

WINDOW = 10_000
BATCH = 1_000  # a store read batch / a lane's batch of completions


def _in_order(t: CommitTracker, total: int, perm: list[int]) -> None:
    dispatch, done, committable = t.dispatch, t.done, t.committable
    for p in range(total):
        done(dispatch(p * 2))
        committable()


def _random(t: CommitTracker, total: int, perm: list[int]) -> None:
    # The window fills, then its events finish in a shuffled order (one shuffle, reused).
    dispatch, done, committable = t.dispatch, t.done, t.committable
    for start in range(0, total, WINDOW):
        for p in range(start, start + WINDOW):
            dispatch(p * 2)
        for j in perm:
            done(start + j)
            committable()


def _in_order_batched(t: CommitTracker, total: int, perm: list[int]) -> None:
    dispatch_many, done_many, committable = t.dispatch_many, t.done_many, t.committable
    for start in range(0, total, BATCH):
        done_many(dispatch_many(range(start * 2, (start + BATCH) * 2, 2)))
        committable()


def _random_batched(t: CommitTracker, total: int, perm: list[int]) -> None:
    dispatch_many, done_many, committable = t.dispatch_many, t.done_many, t.committable
    for start in range(0, total, WINDOW):
        for b in range(start, start + WINDOW, BATCH):
            dispatch_many(range(b * 2, (b + BATCH) * 2, 2))
        for k in range(0, WINDOW, BATCH):
            done_many(map(start.__add__, perm[k : k + BATCH]))
            committable()


SCENARIOS: list[tuple[str, Callable[[CommitTracker, int, list[int]], None]]] = [
    ("in order, one call each", _in_order),
    ("random in window, one call each", _random),
    (f"in order, batches of {BATCH:,}", _in_order_batched),
    (f"random in window, batches of {BATCH:,}", _random_batched),
]


def _measure(
    scenario: Callable[[CommitTracker, int, list[int]], None], total: int, perm: list[int]
) -> tuple[float, int]:
    t = CommitTracker(window=WINDOW)
    start = time.perf_counter()
    scenario(t, total, perm)
    elapsed = time.perf_counter() - start
    assert t.committable(force=True) in (None, (total - 1) * 2) and t.contiguous == (total - 1) * 2
    # Memory in a separate, smaller run: tracing slows every allocation down.
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        traced = CommitTracker(window=WINDOW)
        scenario(traced, min(total, 200_000), perm)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return total / elapsed, peak


def run(backends: list[str], quick: bool = False) -> None:
    total = 200_000 if quick else 2_000_000
    perm = list(range(WINDOW))
    random.Random(42).shuffle(perm)
    rows = []
    for name, scenario in SCENARIOS:
        rate, peak = _measure(scenario, total, perm)
        rows.append([name, total, rate, f"{peak / 1024:,.0f} KiB"])
    print_table(
        f"CommitTracker, window {WINDOW:,} (acks/s = dispatch + done + committable per event)",
        ["completion order", "events", "acks/s", "peak traced memory"],
        rows,
    )
