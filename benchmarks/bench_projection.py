"""PostgreSQL projections through the processor, in one run: one INSERT per event (plain and
``pipeline=True``) and one ``executemany`` per batch (``on_batch``); every run's rows are
checked equal to the events. ``python benchmarks/run.py projection [--quick]``."""

from __future__ import annotations

import time
from typing import Any

import eventlanes as el

from .common import databases, print_table


def _fill(url: str, events: int) -> None:
    store = el.open_store(url)
    for i in range(events // 100):
        store.append(f"s-{i % 500}", [el.NewEvent("Step", {"n": j}) for j in range(100)])
    store.close()


def _run(url: str, name: str, kind: str) -> float:
    app = el.App(url)
    proc = app.processor(name, segments=4, batch_size=1000, pipeline=kind == "pipelined")
    table = app.db.table(f"rows_{name.replace('-', '_')}")
    app.db.run_ddl([f"CREATE TABLE {table} (stream TEXT, version BIGINT, position BIGINT)"])
    sql = f"INSERT INTO {table} VALUES (%s, %s, %s)"
    if kind == "on_batch":

        @proc.on_batch("Step")
        def batch(events: list[el.Event], ctx: el.Context) -> None:
            ctx.executemany(sql, [(e.stream_id, e.version, e.position) for e in events])

    else:

        @proc.on("Step")
        def one(event: el.Event, ctx: el.Context) -> None:
            ctx.execute(sql, (event.stream_id, event.version, event.position))

    start = time.perf_counter()
    app.start()
    app.wait_until_caught_up(3600)
    seconds = time.perf_counter() - start
    app.stop()
    rows = app.db.query(f"SELECT count(*), count(DISTINCT position) FROM {table}")[0]
    events = app.store.count()
    app.close()
    if tuple(rows) != (events, events):
        raise AssertionError(f"{kind}: {rows} rows for {events} events")
    return events / seconds


def run(backends: list[str], quick: bool = False) -> None:
    if "postgres" not in backends:
        return
    events = 10_000 if quick else 50_000
    rows: list[list[Any]] = []
    with databases(["postgres"]) as urls:
        url = urls["postgres"]()
        _fill(url, events)
        rates: dict[str, float] = {}
        for i, kind in enumerate(["plain", "pipelined", "on_batch"] * 2):  # alternate: noisy
            rates[kind] = max(rates.get(kind, 0.0), _run(url, f"p{i}", kind))
        for kind in ("plain", "pipelined", "on_batch"):
            rows.append([kind, events, rates[kind], f"{rates[kind] / rates['plain']:.1f}x"])
    print_table(
        "PostgreSQL projection through the processor (events/s, 4 segments, fsync on)",
        ["handler", "events", "events/s", "vs plain"],
        rows,
    )
