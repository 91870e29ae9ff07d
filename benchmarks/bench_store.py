"""Event store: appends/s (1-event and 100-event appends, 1 and 8 writer processes) and a full
scan of 1,000,000 events, on a SQLite file and on PostgreSQL. When the ``bench`` extra is
installed, the Python ``eventsourcing`` library's recorder runs the same appends in the same
run and the table shows the ratio.

A second table: a reader that wants 1 of 10 equally frequent event types, reading with
``types=[...]`` (filtered in SQL) against reading everything and filtering in Python (what a
processor did before), in store events passed per second; the two must find the same events."""

from __future__ import annotations

import statistics
import time
from typing import Any

import eventlanes as el

from .common import baseline, databases, print_table, ratio, run_processes

SCAN_EVENTS = 1_000_000


def _append_worker(ready: Any, url: str, writer: int, appends: int, batch: int) -> None:
    store = el.open_store(url)
    events = [el.NewEvent("Counted", {"writer": writer, "i": i}) for i in range(batch)]
    store.append(f"warmup-{writer}", events[:1])
    ready.wait()
    for k in range(appends):
        # Overlapping streams: every writer appends to the same 64 streams.
        store.append(f"stream-{(writer * 7 + k) % 64}", events)
    store.close()


def _fill_worker(ready: Any, url: str, writer: int, events_per_writer: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent("Counted", {"writer": writer, "i": i}) for i in range(500)]
    ready.wait()
    for k in range(events_per_writer // 500):
        store.append(f"fill-{writer}-{k % 1000}", batch)
    store.close()


def _typed_fill_worker(ready: Any, url: str, writer: int, events: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent(f"T{i % 10}", {"writer": writer, "i": i}) for i in range(100)]
    ready.wait()
    for k in range(events // 100):
        store.append(f"typed-{writer}-{k % 500}", batch)
    store.close()


def type_filter_rows(name: str, url: str, events: int) -> list[list[Any]]:
    """Store events passed per second by a reader of type T3: in SQL vs in Python."""
    run_processes(_typed_fill_worker, [(url, w, events // 2) for w in range(2)])
    store = el.open_store(url)
    total = store.count()

    def in_python() -> list[int]:
        return [e.position for e in store.iter_events(batch_size=5000) if e.type == "T3"]

    def in_sql() -> list[int]:
        return [e.position for e in store.iter_events(batch_size=5000, types=["T3"])]

    rates: dict[str, list[float]] = {"all types, filtered in Python": [], "types=['T3']": []}
    found = {}
    for _ in range(3):  # alternate: the machine's load changes from second to second
        for label, fn in zip(rates, (in_python, in_sql), strict=True):
            start = time.perf_counter()
            found[label] = fn()
            rates[label].append(total / (time.perf_counter() - start))
    python_found, sql_found = found.values()
    if python_found != sql_found or len(sql_found) != total // 10:
        raise AssertionError(f"type filter found {len(sql_found)}, Python {len(python_found)}")
    base = statistics.median(rates["all types, filtered in Python"])
    store.close()
    return [
        [name, label, total, len(sql_found), statistics.median(r),
         f"{statistics.median(r) / base:.2f}x"]
        for label, r in rates.items()
    ]  # fmt: skip


def run(backends: list[str], quick: bool = False) -> None:
    rows = []
    typed: list[list[Any]] = []
    scale = 0.2 if quick else 1.0
    es = baseline()
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            for batch in (1, 100):
                for writers in (1, 8):
                    total_appends = int((8000 if batch == 1 else 800) * scale)
                    per = max(1, total_appends // writers)
                    events = per * writers * batch
                    mine: list[float] = []
                    their: list[float] = []
                    for _ in range(3):  # alternate, medians: a single short run is mostly noise
                        url = new_url()
                        el.open_store(url).close()
                        seconds = run_processes(
                            _append_worker, [(url, w, per, batch) for w in range(writers)]
                        )
                        mine.append(events / seconds)
                        if es is not None:
                            target = new_url() if name == "postgres" else new_url().split("///")[1]
                            their.append(
                                es.append_rate(name, target.split("?")[0], batch, writers, events)
                            )
                    ours = statistics.median(mine)
                    theirs = statistics.median(their) if their else None
                    rows.append(
                        [name, f"{batch}-event appends", writers, events, ours, theirs,
                         ratio(ours, theirs)]
                    )  # fmt: skip
            url = new_url()
            store = el.open_store(url)
            n = int(SCAN_EVENTS * scale)
            run_processes(_fill_worker, [(url, w, n // 2) for w in range(2)])
            start = time.perf_counter()
            count = sum(1 for _ in store.iter_events(batch_size=10_000))
            seconds = time.perf_counter() - start
            rows.append([name, "full scan (read)", 1, count, count / seconds, None, ""])
            store.close()
            typed += type_filter_rows(name, new_url(), int(200_000 * scale))
    print_table(
        "event store throughput (events/s; appends: median of 3 alternating runs)",
        ["backend", "operation", "processes", "events", "eventlanes", "eventsourcing", "ratio"],
        rows,
    )
    print_table(
        "reading 1 of 10 equally frequent event types (store events passed per second)",
        ["backend", "reader", "store events", "events of T3", "events/s", "ratio"],
        typed,
    )
