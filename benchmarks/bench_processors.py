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
    """All events in one transaction: they become visible to the workers at once."""
    store = el.open_store(url)
    with store.db.transaction() as conn:
        for s in range(streams):
            events = [el.NewEvent("Counted", {"n": i}) for i in range(PER_STREAM)]
            store.append(f"stream-{s}", events, conn=conn)
    store.close()


def _run(url: str, handler: str, processes: int, streams: int) -> float:
    """Events/s from the moment the events appear until every segment has reached them. The
    workers start on an empty store and share the segments first (process start, imports and
    the initial balancing are not what is measured)."""
    os.environ["EVENTLANES_BENCH_URL"] = url
    os.environ["EVENTLANES_BENCH_HANDLER"] = handler
    from eventlanes.cli.supervisor import Supervisor

    watcher = el.App(url)
    watcher.processor("counter", segments=4)
    from .bench_app import create_schema

    create_schema(watcher)
    supervisor = Supervisor("benchmarks.bench_app:app", processes)
    done = threading.Event()
    started: list[float] = []

    def tick() -> None:
        if not started:
            owners = [s.owner for s in watcher.status("counter").segments]
            if None in owners or len(set(owners)) < processes:
                return
            _fill(url, streams)
            started.append(time.perf_counter())
        elif watcher.status("counter").caught_up:
            done.set()
            supervisor.stop()

    supervisor.run(tick, interval=0.05)
    seconds = time.perf_counter() - started[0]
    total = watcher.store.count()
    counted = watcher.db.query(f"SELECT coalesce(sum(n), 0) FROM {watcher.db.table('counts')}")
    assert done.is_set() and counted[0][0] == total == streams * PER_STREAM, (counted, total)
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
                ours = _run(new_url(), handler, 1, streams)
                rows.append([name, label, 1, ours, theirs, ratio(ours, theirs)])
            cpu = {}
            for processes in (1, 2):
                cpu[processes] = _run(new_url(), "cpu", processes, streams)
                scaling = f"{ratio(cpu[processes], cpu[1])} vs 1 process" if processes > 1 else ""
                rows.append([name, "CPU-bound handler", processes, cpu[processes], None, scaling])
    print_table(
        f"processors: {streams:,} streams x {PER_STREAM} events, counter projection (events/s)",
        ["backend", "handler", "processes", "eventlanes", "eventsourcing", "ratio"],
        rows,
    )
