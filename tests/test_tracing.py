"""OpenTelemetry tracing: appends record their span's context in the events' metadata, and
everything that processes an event runs in a span linked to that append, across processes,
brokers and engines (spans recorded with the SDK's in-memory exporter in this process, and
exported over OTLP/HTTP by `eventlanes run` workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import eventlanes as el
from eventlanes.processing.aggregating.dedupe import Marks, dedupe
from eventlanes.processing.tables.states import Entry
from eventlanes.testing import run_until_caught_up
from tests.processing_helpers import wait_for
from tests.tracing_helpers import (
    OTLPReceiver,
    Span,
    by_key,
    named,
    one,
    parent_of,
    traceparent_key,
)

ROOT = Path(__file__).resolve().parent.parent
E = el.NewEvent
tracer = trace.get_tracer("tests")


def _with(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


def _walk_to_root(span: Span, spans: list[Span]) -> list[str]:
    """From ``span`` back to what caused it: its (first) link, else its parent, until a span
    with neither."""
    keyed = by_key(spans)
    path = [span.name]
    while True:
        if span.links:
            nxt = keyed.get(span.links[0])
        elif span.parent_id is not None:
            nxt = keyed.get((span.trace_id, span.parent_id))
        else:
            return path
        assert nxt is not None, f"{span.name}: its parent or link was not recorded"
        span = nxt
        path.append(span.name)


# -- appending -------------------------------------------------------------------------------
def test_append_records_the_sampled_span_context(store_url: str, recorded_spans) -> None:
    store = el.open_store(store_url)
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        with tracer.start_as_current_span("request"):
            positions = store.append("order-1", [
                E("Placed"), E("Paid", {"n": 1}, {"user": "carlo"}),
                E("Shipped", {}, {"traceparent": own}),  # the caller's own: kept
            ])  # fmt: skip
        store.append("order-2", [E("Placed")])  # no span: no trace keys
        # A span that is not sampled: nothing recorded downstream would be kept, so nothing.
        unsampled = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0))
        with trace.use_span(NonRecordingSpan(unsampled)):
            store.append("order-3", [E("Placed")])
        # A remote parent with a tracestate: the append span inherits it, events carry it.
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                             trace_state=TraceState([("shop", "eu-1")]))  # fmt: skip
        with trace.use_span(NonRecordingSpan(remote)):
            store.append("order-4", [E("Placed")])
        events = store.read()
    finally:
        store.close()
    spans = recorded_spans.spans()
    request = one(spans, "request")
    append = one(spans, "append", **{"eventlanes.stream": "order-1"})
    assert append.kind == "PRODUCER" and append.parent_id == request.span_id
    assert append.attributes["messaging.batch.message_count"] == 3
    assert append.attributes["eventlanes.position"] == positions[0]
    assert append.attributes["eventlanes.position.last"] == positions[-1]
    placed, paid, shipped, untraced, unsampled_event, remote_event = events
    assert traceparent_key(placed.metadata["traceparent"]) == append.key
    assert int(placed.metadata["traceparent"][-2:], 16) & 1  # the sampled flag
    assert paid.metadata == {"traceparent": placed.metadata["traceparent"], "user": "carlo"}
    assert shipped.metadata == {"traceparent": own}
    assert untraced.metadata == {} and unsampled_event.metadata == {}
    assert remote_event.metadata["tracestate"] == "shop=eu-1"
    assert traceparent_key(remote_event.metadata["traceparent"])[0] == 0xABC
    assert not named(spans, "append", **{"eventlanes.stream": "order-3"})


def test_trace_off_writes_no_trace_context(store_url: str, recorded_spans) -> None:
    """``?trace=off``: appends under a span write no trace keys (nor an append span), and a
    republisher into that store adds none to its outputs."""
    app = el.App(_with(store_url, "trace=off"))
    assert not app.store.trace_context
    rep = app.republisher("copy", to_stream="copies")
    rep.on("Placed")(lambda event: E("Copied", {"of": event.position}))
    seen = app.processor("seen")
    seen.on_any(lambda event, ctx: None)
    with tracer.start_as_current_span("request"):
        app.store.append("order-1", [E("Placed"), E("Placed", {}, {"user": "carlo"})])
    run_until_caught_up(app)
    events = app.store.read()
    assert [e.type for e in events] == ["Placed", "Placed", "Copied", "Copied"]
    assert events[0].metadata == {} and events[1].metadata == {"user": "carlo"}
    assert all(set(e.metadata) == {"source_chain"} for e in events[2:])
    spans = recorded_spans.spans()
    assert not named(spans, "append")
    assert named(spans, "process copy")  # processing is still traced: only the keys are off
    app.close()
    for bad in ("trace=maybe", "trace="):
        with pytest.raises(el.InvalidInputError, match=r"invalid trace=.*: on or off"):
            el.App(_with(store_url, bad))


def test_dedupe_fast_rule_takes_traced_events_but_not_chained_ones() -> None:
    """The row path's fast rule (no step per event) holds for events whose metadata is only a
    trace context; a source chain still sends the batch event by event."""
    tp = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    chain = '{"source_chain":[{"source":"up","partition":"","offset":%d,"out":0}]}'
    for meta, fast in ((tp, True), (chain, False)):
        events = [el.Event(p, "s", p, "T", {}, meta.replace("%d", str(p)), 0, 0) for p in (1, 2, 3)]
        entries = {"k": Entry({})}
        marks = Marks()
        assert dedupe(events, ["k"] * 3, entries, "el_events", marks) == [0, 1, 2]
        # The fast rule leaves the newest position pending in the marks; the event-by-event
        # path writes every input's coordinates into the entry's offsets.
        assert bool(marks.pending) is fast, meta
        assert (entries["k"].offsets == {}) is fast


# -- processing in another process -------------------------------------------------------------
def test_span_tree_from_an_append_to_handlers_in_another_process(
    store_url: str, recorded_spans
) -> None:
    """`eventlanes run` configured by the OTEL_* variables exports its spans over OTLP: the
    batch spans link to the append made in this process, each handler call is a child of its
    batch linked to the append, and the token's commit is a child of the batch."""
    from tests.apps.traced_app import create_schema

    app = el.App(store_url)
    table = create_schema(app)
    with OTLPReceiver() as receiver:
        env = dict(os.environ)
        env.update({
            "EVENTLANES_TEST_APP_URL": store_url,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "shop-workers",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        })  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.traced_app:app",
             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            with tracer.start_as_current_span("checkout"):
                traced = app.store.append("order-1", [E("LineAdded"), E("LineAdded")])
            app.store.append("order-2", [E("LineAdded")])
            wait_for(lambda: app.db.query(f"SELECT count(*) FROM {table}")[0][0] == 3,
                     timeout=60, what="the projection")  # fmt: skip
            wait_for(lambda: len(named(receiver.received, "handle LineAdded")) == 6,
                     timeout=60, what="the handler spans of both processors")  # fmt: skip
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
    received = list(receiver.received)  # flushed when the worker stopped
    append = one(recorded_spans.spans(), "append", **{"eventlanes.stream": "order-1"})
    assert {s.service for s in received} == {"shop-workers"}
    for name, guarantee in (("lines", "exactly-once"), ("mailer", "at-least-once")):
        handlers = named(received, "handle LineAdded", **{"eventlanes.processor": name})
        assert sorted(h.attributes["eventlanes.position"] for h in handlers) == [1, 2, 3]
        for h in handlers:
            batch = parent_of(h, received)
            assert batch is not None and batch.name == f"process {name}", h
            assert batch.kind == "CONSUMER" and batch.parent_id is None  # a trace of its own
            assert batch.attributes["eventlanes.guarantee"] == guarantee
            assert batch.attributes["eventlanes.segment"] == h.attributes["eventlanes.segment"]
            assert h.attributes["eventlanes.guarantee"] == guarantee
            assert h.attributes["eventlanes.handler"] == ("add_line" if name == "lines" else "mail")
            if h.attributes["eventlanes.position"] in traced:
                assert h.links == (append.key,) and batch.linked_to(append)
                assert h.attributes["eventlanes.stream"] == "order-1"
            else:
                assert h.links == ()
        commits = named(received, f"commit {name}")
        assert commits and all(parent_of(c, received) is not None for c in commits)
        assert max(c.attributes["eventlanes.token"] for c in commits) == 3
    first = one(received, "handle LineAdded", **{"eventlanes.processor": "lines",
                                                 "eventlanes.position": traced[0]})  # fmt: skip
    path = _walk_to_root(first, received + recorded_spans.spans())
    assert path == ["handle LineAdded", "append", "checkout"]


# -- dead letters, republishers ----------------------------------------------------------------
def test_dead_letter_parking_and_retry_are_linked_to_the_append(
    store_url: str, recorded_spans
) -> None:
    app = el.App(store_url)
    orders = app.processor("orders", on_error="dead_letter")
    broken = [True]

    @orders.on("Placed")
    def place(event: el.Event, ctx: el.Context) -> None:
        if broken[0] and event.data.get("bad"):
            raise ValueError("no e-mail address")

    with tracer.start_as_current_span("request") as request:
        app.store.append("order-1", [E("Placed", {"bad": True}), E("Placed")])  # 2nd waits
    app.store.append("order-2", [E("Placed")])
    run_until_caught_up(app, dead_letters=True)
    spans = recorded_spans.spans()
    append = one(spans, "append")
    parks = named(spans, "park orders")
    assert sorted(p.attributes["eventlanes.position"] for p in parks) == [1, 2]
    for park in parks:
        assert park.links == (append.key,)
        assert park.attributes["eventlanes.key"] == "order-1"
        assert park.attributes["eventlanes.guarantee"] == "exactly-once"
        batch = parent_of(park, spans)
        assert batch is not None and batch.name == "process orders" and batch.linked_to(append)
    assert "no e-mail address" in one(parks, "park orders", **{"eventlanes.position": 1}
                                      ).attributes["eventlanes.dead_letter.reason"]  # fmt: skip
    failed = [s for s in named(spans, "handle Placed") if s.status == "ERROR"]
    assert failed and all(s.links == (append.key,) and "exception" in s.events for s in failed)

    broken[0] = False
    recorded_spans.exporter.clear()
    with tracer.start_as_current_span("operator") as operator:
        assert app.retry_dead_letters("orders") == (2, 0)
    spans = recorded_spans.spans()
    retry = one(spans, "retry orders")
    assert retry.parent_id == operator.get_span_context().span_id  # asked for by the caller
    assert retry.kind == "CONSUMER" and retry.linked_to(append) and retry.status == "UNSET"
    assert retry.attributes["eventlanes.key"] == "order-1"
    handled = named(spans, "handle Placed")
    assert sorted(h.attributes["eventlanes.position"] for h in handled) == [1, 2]
    assert all(parent_of(h, spans) == retry and h.links == (append.key,) for h in handled)
    assert request.get_span_context().trace_id == append.trace_id
    app.close()


def test_a_failed_retry_is_recorded_on_its_span(store_url: str, recorded_spans) -> None:
    app = el.App(store_url)
    orders = app.processor("orders", on_error="dead_letter")
    orders.on("Placed")(lambda event, ctx: 1 / 0)
    with tracer.start_as_current_span("request"):
        app.store.append("order-1", [E("Placed")])
    run_until_caught_up(app, dead_letters=True)
    assert app.retry_dead_letters("orders") == (0, 1)
    retry = one(recorded_spans.spans(), "retry orders")
    assert retry.status == "ERROR" and "exception" in retry.events
    app.close()


def test_a_republishers_outputs_lead_back_to_the_root(store_url: str, recorded_spans) -> None:
    """Each output carries the context of the mapping call that made it: that span links to
    its input's append, whose parent is the request; processors of the outputs link to it."""
    app = el.App(store_url)
    split = app.republisher("split", to_stream=lambda e: f"robot-{e.data['robot']}")

    @split.on("Raw")
    def outputs(event: el.Event) -> list[el.NewEvent]:
        return [E("Screws", {"robot": event.data["robot"], "n": n}) for n in event.data["ns"]]

    count = app.processor("count")
    count.on("Screws")(lambda event, ctx: None)
    with tracer.start_as_current_span("request") as request:
        app.store.append("cell-1", [E("Raw", {"robot": "r7", "ns": [3, 4]})])
        app.store.append("cell-2", [E("Raw", {"robot": "r8", "ns": [5]})])
    run_until_caught_up(app)
    spans = recorded_spans.spans()
    keyed = by_key(spans)
    outs = [e for e in app.store.read() if e.type == "Screws"]
    assert len(outs) == 3
    for out in outs:
        mapping = keyed[traceparent_key(out.metadata["traceparent"])]
        assert (
            mapping.name == "handle Raw" and mapping.attributes["eventlanes.processor"] == "split"
        )
        (link,) = mapping.links
        append = keyed[link]
        assert append.name == "append" and append.parent_id == request.get_span_context().span_id
        # the mapping's input is the root of the output's chain
        assert append.attributes["eventlanes.position"] == out.metadata["source_chain"][0]["offset"]
        assert mapping.attributes["eventlanes.position"] == append.attributes["eventlanes.position"]
        handler = one(spans, "handle Screws", **{"eventlanes.position": out.position})
        assert handler.links == (mapping.key,)
        assert _walk_to_root(handler, spans) == ["handle Screws", "handle Raw", "append", "request"]
    # The outputs' appends are children of the republisher's batches.
    for stream in ("robot-r7", "robot-r8"):
        parent = parent_of(one(spans, "append", **{"eventlanes.stream": stream}), spans)
        assert parent is not None and parent.name == "process split"
    app.close()


def test_aggregation_batches_and_state_writes_are_traced(tmp_path: Path, recorded_spans) -> None:
    """A Python fold's batch links to the appends; a range folded inside SQLite (no events in
    Python) says so and gives its count and positions; state writes are commit spans."""
    app = el.App(f"sqlite:///{tmp_path}/a.db")
    totals = app.aggregation("totals", key="sku", on="LineAdded", fields={"n": el.count()})
    sums = app.aggregation("sums", key="sku", initial=lambda: {"n": 0})

    @sums.on("LineAdded")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1

    with tracer.start_as_current_span("request"):
        app.store.append("order-1", [E("LineAdded", {"sku": "wheel"}) for _ in range(3)])
    run_until_caught_up(app)
    assert totals.get("wheel") == sums.get("wheel") == {"n": 3}
    assert totals.pushed_down == 3
    spans = recorded_spans.spans()
    append = one(spans, "append")
    (python,) = [b for b in named(spans, "process sums") if b.attributes.get(
        "messaging.batch.message_count")]  # fmt: skip
    assert python.linked_to(append) and python.attributes["eventlanes.pushdown"] is False
    assert python.attributes["eventlanes.guarantee"] == "aggregation"
    (folded,) = [b for b in named(spans, "process totals") if b.attributes.get(
        "messaging.batch.message_count")]  # fmt: skip
    assert folded.links == () and folded.attributes["eventlanes.pushdown"] is True
    assert folded.attributes["eventlanes.position"] == 1
    assert folded.attributes["eventlanes.position.last"] == 3
    for name in ("totals", "sums"):
        commits = named(spans, f"commit {name}")
        assert commits and max(c.attributes["eventlanes.token"] for c in commits) == 3
    app.close()


# -- Kafka ---------------------------------------------------------------------------------------
def test_a_trace_crosses_the_broker(store_url: str, kafka_broker, recorded_spans) -> None:
    """Publish -> Kafka -> ingest: the record carries the publish span's context in its
    ``traceparent`` header; the ingested event carries it in its metadata; the ingest span
    links to it; a handler of the ingested event leads back to the request that appended the
    published one."""
    from tests.kafka_helpers import create_topic, read_all

    topic = create_topic(kafka_broker.bootstrap, 1)
    kafka = el.Kafka(kafka_broker.bootstrap)
    app = el.App(store_url)
    app.publisher("out", el.KafkaSink(kafka, topic), on=["Placed"])
    app.ingest(
        "in",
        kafka,
        topic=topic,
        type="Received",
        stream=lambda r: f"in-{r.key.decode()}",
        trust_chains=False,
    )  # its own events come back: their chains name this store
    seen = app.processor("seen")
    seen.on("Received")(lambda event, ctx: None)
    with tracer.start_as_current_span("request"):
        app.store.append("order-1", [E("Placed", {"n": 1}), E("Placed", {"n": 2})])
    app.start()
    try:
        wait_for(lambda: app.ingest_status("in").position >= 2, timeout=60, what="the ingest")
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    spans = recorded_spans.spans()
    append = one(spans, "append", **{"eventlanes.stream": "order-1"})
    publish = one(spans, f"publish {topic}")
    assert publish.kind == "PRODUCER" and publish.attributes["messaging.system"] == "kafka"
    assert publish.attributes["messaging.batch.message_count"] == 2
    on_batch = parent_of(publish, spans)
    assert on_batch is not None and on_batch.name == "handle batch" and on_batch.linked_to(append)
    records = read_all(kafka_broker.bootstrap, topic, 1)[0]
    assert [traceparent_key(dict(r.headers())["traceparent"].decode()) for r in records] == [
        publish.key
    ] * 2
    received = [e for e in app.store.read() if e.type == "Received"]
    assert len(received) == 2
    for event in received:
        assert traceparent_key(event.metadata["traceparent"]) == publish.key
        handler = one(spans, "handle Received", **{"eventlanes.position": event.position})
        assert handler.links == (publish.key,)
        assert _walk_to_root(handler, spans) == [
            "handle Received",
            f"publish {topic}",
            "handle batch",
            "append",
            "request",
        ]
    ingest = one(spans, "ingest in")
    assert ingest.kind == "CONSUMER" and ingest.linked_to(publish)
    assert ingest.attributes["eventlanes.ingestor"] == "in"
    assert ingest.attributes["messaging.destination.name"] == topic
    app.close()


# -- Spark -----------------------------------------------------------------------------------------
def test_a_spark_replay_is_one_span(spark, tmp_path: Path, recorded_spans) -> None:
    """A replay is one span per job, never one per event; traced events (trace-only metadata)
    fold on Spark exactly as by the local engine."""
    from eventlanes import spark as els

    app = el.App(f"sqlite:///{tmp_path}/s.db", claim_timeout=5)
    fields = {"n": el.count(), "total": el.sum("ok")}
    local = app.aggregation("local", key="robot", on="Screws", fields=fields)
    replayed = app.aggregation("replayed", key="robot", on="Screws", fields=fields)
    rows = app.processor("rows")
    table = app.db.table("rows")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT)"])
    rows.on("Screws")(lambda e, ctx: ctx.execute(f"INSERT INTO {table} VALUES (?)", (e.position,)))
    with tracer.start_as_current_span("request"):
        for i in range(20):
            app.store.append(f"cell-{i}", [E("Screws", {"robot": f"r{j % 3}", "ok": j})
                                           for j in range(10)])  # fmt: skip
    chain = {"source_chain": [{"source": "up", "partition": "", "offset": 1, "out": 0}]}
    app.store.append("cell-x", [E("Screws", {"robot": "r0", "ok": 5}, chain)] * 2)  # a duplicate
    run_until_caught_up(app, "local")
    recorded_spans.exporter.clear()
    for name in ("replayed", "rows"):
        result = els.replay(app, name, spark=spark)
        assert result.events == 202
    spans = recorded_spans.spans()
    for name in ("replayed", "rows"):
        job = one(spans, f"replay {name}")
        assert job.attributes["eventlanes.engine"] == "spark"
        assert job.attributes["messaging.batch.message_count"] == 202
        assert job.attributes["eventlanes.token"] == 202
    assert not named(spans, "handle Screws") and not named(spans, "process rows")
    assert replayed.get("r0") == local.get("r0") and replayed.get("r1") == local.get("r1")
    assert app.db.query(f"SELECT count(*) FROM {table}")[0][0] == 202
    app.close()


# -- configuration -------------------------------------------------------------------------------
def test_run_refuses_an_unknown_exporter_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, EVENTLANES_TEST_APP_URL=f"sqlite:///{tmp_path}/c.db",
               OTEL_TRACES_EXPORTER="zipkin-ish")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.traced_app:app",
         "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == [
        "error: OTEL_TRACES_EXPORTER: no span exporter 'zipkin-ish' is installed; installed: "
        "otlp, console, otlp_proto_http"
    ], lines


def test_the_readme_tracing_example_runs(tmp_path: Path) -> None:
    """The set-up example of docs/how-to/tracing.md, in a process of its own (one tracer
    provider per process), exporting over OTLP/HTTP to a receiver here."""
    import re

    page = (ROOT / "docs" / "how-to" / "tracing.md").read_text()
    block = re.search(r"```py\n(.*?)```", page, flags=re.S)
    assert block is not None
    script = tmp_path / "readme_tracing.py"
    script.write_text(block.group(1))
    with OTLPReceiver() as receiver:
        env = dict(os.environ, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint)
        done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
    spans = list(receiver.received)
    append = one(spans, "append")
    printed = done.stdout.strip()
    flags = printed[-4:-2]
    expected = f"00-{append.trace_id:032x}-{append.span_id:016x}-{flags}"
    assert printed == f"{{'traceparent': '{expected}'}}"
    assert int(flags, 16) & 1  # sampled
    handler = one(spans, "handle Placed")
    assert handler.links == (append.key,) and handler.service == "shop"
    assert _walk_to_root(handler, spans) == ["handle Placed", "append", "checkout"]
    assert {s.name for s in spans} == {"checkout", "append", "process orders", "handle Placed",
                                       "commit orders"}  # fmt: skip
