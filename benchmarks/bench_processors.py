"""Processors on the Python `eventsourcing` library's workload: 10,000 streams x 10 events, a
projection that counts events with its token tracked (exactly-once), on SQLite and PostgreSQL;
plus a CPU-bound handler in 1 and 2 processes. The eventsourcing baseline runs in the same run
when the `bench` extra is installed."""

from __future__ import annotations

import os
import threading
import time

import eventlanes as el

from .common import baseline, databases, print_table, ratio

STREAMS, PER_STREAM = 10_000, 10


def _fill(url: str, streams: int) -> None:
    store = el.open_store(url)
    for s in range(streams):
        store.append(f"stream-{s}", [el.NewEvent("Counted", {"n": i}) for i in range(PER_STREAM)])
    store.close()


def _run(url: str, handler: str, processes: int) -> float:
    """Events/s from start until every segment has reached the head."""
    os.environ["EVENTLANES_BENCH_URL"] = url
    os.environ["EVENTLANES_BENCH_HANDLER"] = handler
    from eventlanes.supervisor import Supervisor

    watcher = el.App(url)
    watcher.processor("counter", segments=4)
    from .bench_app import create_schema

    create_schema(watcher)
    total = watcher.store.count()
    supervisor = Supervisor("benchmarks.bench_app:app", processes)
    done = threading.Event()
    started: list[float] = []

    def tick() -> None:
        # The clock starts when every worker is up (process start and imports excluded).
        if not started and len(watcher.tokens.live_nodes("counter")) >= processes:
            started.append(time.perf_counter())
        if started and watcher.status("counter").caught_up:
            done.set()
            supervisor.stop()

    supervisor.run(tick, interval=0.1)
    seconds = time.perf_counter() - started[0]
    counted = watcher.db.query(f"SELECT coalesce(sum(n), 0) FROM {watcher.db.table('counts')}")
    assert done.is_set() and counted[0][0] == total, (counted, total)
    watcher.close()
    return total / seconds


def run(backends: list[str], quick: bool = False) -> None:
    streams = 2000 if quick else STREAMS
    es = baseline()
    rows = []
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            theirs = None
            if es is not None:
                target = new_url() if name == "postgres" else new_url().split("///")[1]
                _, theirs = es.projection_rate(name, target.split("?")[0], streams, PER_STREAM)
            for handler, label in (("row", "one upsert per event"), ("batch", "on_batch upserts")):
                url = new_url()
                _fill(url, streams)
                ours = _run(url, handler, 1)
                rows.append([name, label, 1, ours, theirs, ratio(ours, theirs)])
            cpu = {}
            for processes in (1, 2):
                url = new_url()
                _fill(url, streams)
                cpu[processes] = _run(url, "cpu", processes)
                scaling = f"{ratio(cpu[processes], cpu[1])} vs 1 process" if processes > 1 else ""
                rows.append([name, "CPU-bound handler", processes, cpu[processes], None, scaling])
    print_table(
        f"processors: {streams:,} streams x {PER_STREAM} events, counter projection (events/s)",
        ["backend", "handler", "processes", "eventlanes", "eventsourcing", "ratio"],
        rows,
    )
