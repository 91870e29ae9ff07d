"""Event store: appends/s (1-event and 100-event appends, 1 and 8 writer processes) and a full
scan of 1,000,000 events, on a SQLite file and on PostgreSQL. When the ``bench`` extra is
installed, the Python ``eventsourcing`` library's recorder runs the same appends in the same
run and the table shows the ratio."""

from __future__ import annotations

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


def run(backends: list[str], quick: bool = False) -> None:
    rows = []
    scale = 0.2 if quick else 1.0
    es = baseline()
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            for batch in (1, 100):
                for writers in (1, 8):
                    url = new_url()
                    el.open_store(url).close()
                    total_appends = int((8000 if batch == 1 else 800) * scale)
                    per = max(1, total_appends // writers)
                    seconds = run_processes(
                        _append_worker, [(url, w, per, batch) for w in range(writers)]
                    )
                    events = per * writers * batch
                    ours = events / seconds
                    theirs = None
                    if es is not None:
                        target = new_url() if name == "postgres" else new_url().split("///")[1]
                        theirs = es.append_rate(name, target.split("?")[0], batch, writers, events)
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
    print_table(
        "event store throughput (events/s)",
        ["backend", "operation", "processes", "events", "eventlanes", "eventsourcing", "ratio"],
        rows,
    )
