"""The cost of OpenTelemetry tracing: appends and a projection with tracing off (no SDK),
with the SDK and a sampler that drops every span, and with the SDK recording every span (batch
span processor, an exporter that counts and drops), alternating in one run, on each backend.

Each measurement runs in a fresh process (the SDK is installed once per process, and "off"
must not have it loaded). Modes:

* ``off``: no SDK (only the API, as installed with eventlanes); appends check for a span;
* ``trace=off``: no SDK and the store URL option ``?trace=off`` (appends do not even look):
  the baseline, and for processing (where it changes nothing) the noise between runs;
* ``sampled out``: SDK, sampler ``always_off``: spans are started and dropped;
* ``on``: SDK, every span recorded and exported (counted, checked, dropped).

Workloads: ``append``: STREAMS appends of 10 events, each inside a request span (the caller's
own, as a web request would be); ``projection``: the same events handled by a processor with 4
segments and one upsert per event, from start to caught up (the events were appended in the
same mode, so with tracing on they carry a traceparent and batches link to them). Each run's
projection is checked against the store, and with tracing on the handler spans exported are
checked to be one per event.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from typing import Any

from .common import databases, print_table

STREAMS, PER_STREAM, ROUNDS = 10_000, 10, 5
MODES = ["trace=off", "off", "sampled out", "on"]


def _setup(mode: str) -> Any:
    """Install the SDK as ``mode`` says; the span counter for "on", else None."""
    if mode in ("off", "trace=off"):
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class Counting(SpanExporter):
        def __init__(self) -> None:
            self.names: dict[str, int] = {}

        def export(self, spans: Any) -> SpanExportResult:
            for s in spans:
                self.names[s.name] = self.names.get(s.name, 0) + 1
            return SpanExportResult.SUCCESS

    exporter = Counting()
    provider = TracerProvider(sampler=ALWAYS_ON if mode == "on" else ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 21,
                                                   max_export_batch_size=4096))  # fmt: skip
    trace.set_tracer_provider(provider)
    return (provider, exporter)


def _child(mode: str, url: str, streams: int, out: Any) -> None:
    from opentelemetry import trace

    import eventlanes as el

    sdk = _setup(mode)
    if mode == "trace=off":
        url = f"{url}{'&' if '?' in url else '?'}trace=off"
    tracer = trace.get_tracer("bench")
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

    @counter.on_any
    def count_one(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(upsert, (event.stream_id, 1))

    store = app.store
    events = [el.NewEvent("Counted", {"n": i}) for i in range(PER_STREAM)]
    started = time.perf_counter()
    for s in range(streams):
        with tracer.start_as_current_span("request"):
            store.append(f"stream-{s}", events)
    append_seconds = time.perf_counter() - started
    total = streams * PER_STREAM
    traced = sum("traceparent" in e.metadata for e in store.read(limit=total))
    assert traced == (total if mode == "on" else 0), (mode, traced)
    app.start()
    started = time.perf_counter()
    app.wait_until_caught_up(600)
    seconds = time.perf_counter() - started
    app.stop()
    counted = app.db.query(f"SELECT coalesce(sum(n), 0) FROM {table}")[0][0]
    assert counted == total, (counted, total)
    if sdk is not None:
        provider, exporter = sdk
        provider.force_flush(60_000)
        names = exporter.names
        if mode == "on":  # one handler span per event, one append span per append
            assert names.get("handle Counted") == total, names
            assert names.get("append") == streams, names
            assert names.get("process counter", 0) >= 4, names
        else:
            assert not names, names
    app.close()
    out.put((total / append_seconds, total / seconds))


def _measure(mode: str, url: str, streams: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(mode, url, streams, out))
    proc.start()
    result = out.get(timeout=1200)
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"tracing benchmark ({mode}) failed with exit code {proc.exitcode}")
    return result


def run(backends: list[str], quick: bool = False) -> None:
    streams = 1000 if quick else STREAMS
    rounds = 1 if quick else ROUNDS
    rows = []
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            rates: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            for _ in range(rounds):
                for mode in MODES:  # alternate: drift hits every mode alike
                    rates[mode].append(_measure(mode, new_url(), streams))
            for i, workload in enumerate(["append (a request span each)",
                                          "projection, one upsert per event"]):  # fmt: skip
                med = {m: statistics.median(r[i] for r in rates[m]) for m in MODES}
                off = med["off"]
                rows.append([name, workload, *(med[m] for m in MODES),
                             f"{med['trace=off'] / off:.3f}", f"{med['sampled out'] / off:.3f}",
                             f"{med['on'] / off:.3f}"])  # fmt: skip
    print_table(
        f"Tracing cost: {streams * PER_STREAM:,} events ({streams:,} appends of {PER_STREAM}), "
        f"4 segments, 1 process (median of {rounds}, events/s; ratios to off)",
        ["store", "workload", *MODES, "trace=off/off", "sampled out/off", "on/off"],
        rows,
    )
