"""A processor handling 1 of 10 equally frequent event types: reading only its type (filtered
in SQL, the token still passing the others) against reading every event and skipping nine in
Python (what it did before), in one run, one process each. The handled events are checked
equal to a plain count of the store.

``python benchmarks/run.py types [--quick] [--backend sqlite|postgres]``."""

from __future__ import annotations

import time
from typing import Any

import eventlanes as el

from .common import databases, print_table

TYPES = [f"T{i}" for i in range(10)]


def _fill(url: str, events: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent(t, {"n": i}) for i, t in enumerate(TYPES * 10)]
    for i in range(events // len(batch)):
        store.append(f"s-{i % 200}", batch)
    store.close()


def _run(url: str, name: str, filtered: bool) -> tuple[float, int]:
    app = el.App(url)
    proc = app.processor(name, segments=2, batch_size=1000)  # a new name: from the start
    seen = [0]

    @proc.on("T3")
    def count(event: el.Event, ctx: el.Context) -> None:
        seen[0] += 1

    if not filtered:  # as before: read everything, no handler for nine types in ten
        proc.handled_types = lambda: None  # type: ignore[method-assign]
    start = time.perf_counter()
    app.start()
    app.wait_until_caught_up(3600)
    seconds = time.perf_counter() - start
    app.stop()
    events = app.store.count()
    app.close()
    return events / seconds, seen[0]


def run(backends: list[str], quick: bool = False) -> None:
    events = 20_000 if quick else 200_000
    rows: list[list[Any]] = []
    with databases(backends) as urls:
        for backend, make_url in urls.items():
            url = make_url()
            _fill(url, events)
            expected = sum(1 for e in el.open_store(url).iter_events() if e.type == "T3")
            results = {}
            for i, filtered in enumerate((False, True, False, True)):  # alternate: noisy box
                rate, seen = _run(url, f"one-type-{i}", filtered)
                if seen != expected:
                    raise AssertionError(f"{backend}: handled {seen} of {expected} T3 events")
                results.setdefault(filtered, []).append(rate)
            before, after = max(results[False]), max(results[True])
            rows.append([backend, events, before, after, f"{after / before:.1f}x"])
    print_table(
        "a processor handling 1 of 10 types (store events/s to catch up)",
        ["backend", "events", "read all (before)", "types= in SQL", "ratio"],
        rows,
    )
