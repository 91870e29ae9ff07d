"""PostgreSQL projections through the processor, in one run: one INSERT per event (plain,
written with ``?`` placeholders that ``ctx.execute`` translates, and ``pipeline=True``), one
``executemany`` per batch and one ``ctx.insert_rows`` (COPY) per batch (``on_batch``); every
run's rows are
checked equal to the events. Beside them, on the same server and events, the raw loops of
:mod:`benchmarks.bench_postgres` (read, insert, fenced token update, commit; no processor).
Targets: 20k events/s one statement per event, 60k with ``on_batch``.
``python benchmarks/run.py projection [--quick]``."""

from __future__ import annotations

import time
from typing import Any

import eventlanes as el

from .bench_postgres import projection as raw_projection
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
    if kind == "plain ?":  # the portable style: translated (once, then cached) for psycopg
        sql = f"INSERT INTO {table} VALUES (?, ?, ?)"
    if kind == "on_batch":

        @proc.on_batch("Step")
        def batch(events: list[el.Event], ctx: el.Context) -> None:
            ctx.executemany(sql, [(e.stream_id, e.version, e.position) for e in events])

    elif kind == "insert_rows":

        @proc.on_batch("Step")
        def copied(events: list[el.Event], ctx: el.Context) -> None:
            rows = [(e.stream_id, e.version, e.position) for e in events]
            ctx.insert_rows(table, ["stream", "version", "position"], rows)

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
        raw = raw_projection(url, events)
        for variant, (_rate, (count, _)) in raw.items():
            if count != events:
                raise AssertionError(f"raw {variant}: {count} rows for {events} events")
        rates: dict[str, float] = {}
        kinds = ["plain", "plain ?", "pipelined", "on_batch", "insert_rows"]
        for i, kind in enumerate(kinds + kinds[::-1]):  # alternate, both orders: noisy
            rates[kind] = max(rates.get(kind, 0.0), _run(url, f"p{i}", kind))
        raw_plain = raw["plain transaction"][0]
        for variant, (rate, _) in raw.items():
            rows.append([f"raw loop, {variant}", events, rate, f"{rate / raw_plain:.2f}x"])
        for kind, target in (("plain", 20_000), ("plain ?", 20_000), ("pipelined", 20_000),
                             ("on_batch", 60_000), ("insert_rows", 60_000)):  # fmt: skip
            rate = rates[kind]
            what = "on_batch with ctx.insert_rows (COPY)" if kind == "insert_rows" else kind
            if kind == "on_batch":
                what = "on_batch with ctx.executemany"
            if kind == "plain ?":
                what = f"plain, ? placeholders ({rate / rates['plain']:.2f}x plain %s)"
            rows.append([f"processor, {what} (target {target:,})", events, rate,
                         f"{rate / raw_plain:.2f}x"])  # fmt: skip
    print_table(
        "PostgreSQL projection: raw loops (500 events per commit) and through the processor "
        "(4 segments, batch 1000) (events/s, fsync on)",
        ["what", "events", "events/s", "vs raw plain"],
        rows,
    )
