"""The cost of Prometheus metrics on processor throughput: the same projection with and without
``metrics_port`` (scraped twice a second meanwhile), alternating in one run, on each backend.

Workload: STREAMS streams x 10 events appended in one transaction once the processor holds its
4 segments; events/s from then until every segment has reached the head. Each run's projection
is checked against the store (one count per event) and, with metrics, the scraped
``eventlanes_events_handled_total`` against the events handled.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import eventlanes as el

from .common import databases, print_table

STREAMS, PER_STREAM, ROUNDS = 10_000, 10, 5


def _app(url: str, handler: str) -> el.App:
    app = el.App(url, claim_timeout=5)
    counter = app.processor("counter", segments=4, batch_size=2000)
    table = app.db.table("counts")
    app.db.run_ddl(
        [f"CREATE TABLE IF NOT EXISTS {table} (stream_id TEXT PRIMARY KEY, n BIGINT NOT NULL)"]
    )
    p = app.db.param
    upsert = (
        f"INSERT INTO {table} (stream_id, n) VALUES ({p}, {p}) "
        f"ON CONFLICT (stream_id) DO UPDATE SET n = {table}.n + excluded.n"
    )
    if handler == "row":

        @counter.on_any
        def count_one(event: el.Event, ctx: el.Context) -> None:
            ctx.execute(upsert, (str(ctx.segment), 1))

    else:

        @counter.on_batch()
        def count_many(events: list[el.Event], ctx: el.Context) -> None:
            ctx.execute(upsert, (str(ctx.segment), len(events)))

    return app


def _handled(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples
        if s.name == "eventlanes_events_handled_total"
    )  # fmt: skip


def _run(url: str, handler: str, metrics: bool, streams: int) -> float:
    app = _app(url, handler)
    app.start(metrics_port=0 if metrics else None)
    stop = threading.Event()
    try:
        while any(s.owner is None for s in app.status("counter").segments):
            time.sleep(0.01)
        port = app.metrics_port
        if port is not None:  # a Prometheus server scraping twice a second

            def scraper() -> None:
                while not stop.wait(0.5):
                    _handled(port)

            threading.Thread(target=scraper, daemon=True).start()
        with app.db.transaction() as conn:
            for s in range(streams):
                events = [el.NewEvent("Counted", {"n": i}) for i in range(PER_STREAM)]
                app.store.append(f"stream-{s}", events, conn=conn)
        started = time.perf_counter()
        app.wait_until_caught_up(600)
        seconds = time.perf_counter() - started
        total = streams * PER_STREAM
        counted = app.db.query(f"SELECT coalesce(sum(n), 0) FROM {app.db.table('counts')}")[0][0]
        assert counted == total, (counted, total)
        if port is not None:
            assert _handled(port) == total
    finally:
        stop.set()
        app.stop()
        app.close()
    return total / seconds


def run(backends: list[str], quick: bool = False) -> None:
    streams = 1000 if quick else STREAMS
    rows = []
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            for handler, label in (("row", "one upsert per event"), ("batch", "on_batch upserts")):
                rates: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(1 if quick else ROUNDS):
                    for metrics in (False, True):  # alternate: drift hits both alike
                        rates[metrics].append(_run(new_url(), handler, metrics, streams))
                without, with_ = (statistics.median(rates[m]) for m in (False, True))
                cost = f"{(1 - with_ / without) * 100:+.1f}%".replace("+-", "-")
                rows.append([name, label, without, with_, cost])
    print_table(
        f"Metrics cost: {streams * PER_STREAM:,} events, 4 segments, 1 process "
        f"(median of {1 if quick else ROUNDS}, events/s)",
        ["store", "handler", "without metrics", "with metrics", "cost"],
        rows,
    )
