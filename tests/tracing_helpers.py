"""Tracing in tests: the SDK with its in-memory exporter for this process, an OTLP/HTTP
receiver for spans exported by other processes (``eventlanes run`` workers), and helpers to
walk span trees and links.

The test process installs one tracer provider for the whole session (OpenTelemetry allows one
per process). Its sampler records only while a test holds the ``recorded_spans`` fixture, so
the rest of the suite runs with the SDK installed and every span dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import Attributes

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


class Switch(Sampler):
    """Samples every root span while ``on``; drops them otherwise."""

    def __init__(self) -> None:
        self.on = False

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        sampler = ALWAYS_ON if self.on else ALWAYS_OFF
        return sampler.should_sample(parent_context, trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return "Switch"


@dataclass
class Recorder:
    exporter: InMemorySpanExporter
    switch: Switch

    def spans(self) -> list[Span]:
        return [Span.of(s) for s in self.exporter.get_finished_spans()]


_recorder: Recorder | None = None
_lock = threading.Lock()


def recorder() -> Recorder:
    """The session's provider (installed on first use)."""
    global _recorder
    with _lock:
        if _recorder is None:
            switch = Switch()
            exporter = InMemorySpanExporter()
            provider = TracerProvider(sampler=ParentBased(switch))
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            assert trace.get_tracer_provider() is provider, "another tracer provider was set"
            _recorder = Recorder(exporter, switch)
        return _recorder


@dataclass(frozen=True)
class Span:
    """A finished span, from this process (SDK) or another (OTLP), in one shape."""

    name: str
    kind: str
    trace_id: int
    span_id: int
    parent_id: int | None
    links: tuple[tuple[int, int], ...]
    attributes: dict[str, Any] = field(hash=False)
    status: str = "UNSET"
    events: tuple[str, ...] = ()
    service: str = ""

    @classmethod
    def of(cls, s: ReadableSpan) -> Span:
        ctx = s.get_span_context()
        assert ctx is not None
        return cls(
            s.name,
            s.kind.name,
            ctx.trace_id,
            ctx.span_id,
            s.parent.span_id if s.parent is not None else None,
            tuple((link.context.trace_id, link.context.span_id) for link in s.links),
            dict(s.attributes or {}),
            s.status.status_code.name,
            tuple(e.name for e in s.events),
            str(s.resource.attributes.get("service.name", "")),
        )

    @property
    def key(self) -> tuple[int, int]:
        return (self.trace_id, self.span_id)

    def linked_to(self, other: Span) -> bool:
        return other.key in self.links


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _from_proto(s: Any, service: str) -> Span:
    return Span(
        s.name,
        KINDS.get(s.kind, str(s.kind)),
        int.from_bytes(s.trace_id, "big"),
        int.from_bytes(s.span_id, "big"),
        int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None,
        tuple(
            (int.from_bytes(lk.trace_id, "big"), int.from_bytes(lk.span_id, "big"))
            for lk in s.links
        ),
        {a.key: _value(a.value) for a in s.attributes},
        {0: "UNSET", 1: "OK", 2: "ERROR"}[s.status.code],
        tuple(e.name for e in s.events),
        service,
    )


class OTLPReceiver:
    """A collector's OTLP/HTTP trace endpoint on 127.0.0.1 (``/v1/traces``, protobuf)."""

    def __init__(self) -> None:
        self.received: list[Span] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for rs in request.resource_spans:
                        service = next((_value(a.value) for a in rs.resource.attributes
                                        if a.key == "service.name"), "")  # fmt: skip
                        for ss in rs.scope_spans:
                            received.extend(_from_proto(s, service) for s in ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def named(spans: Iterable[Span], name: str, **attributes: Any) -> list[Span]:
    """The spans called ``name`` whose attributes include ``attributes``."""
    return [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]


def one(spans: Iterable[Span], name: str, **attributes: Any) -> Span:
    found = named(spans, name, **attributes)
    assert len(found) == 1, (name, attributes, found)
    return found[0]


def by_key(spans: Iterable[Span]) -> dict[tuple[int, int], Span]:
    return {s.key: s for s in spans}


def parent_of(span: Span, spans: Iterable[Span]) -> Span | None:
    if span.parent_id is None:
        return None
    return by_key(spans).get((span.trace_id, span.parent_id))


def traceparent_key(traceparent: str) -> tuple[int, int]:
    """(trace id, span id) of a W3C traceparent."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return (int(trace_id, 16), int(span_id, 16))
