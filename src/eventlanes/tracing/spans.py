"""The spans processing runs in, after OpenTelemetry's messaging conventions.

A batch is a ``CONSUMER`` span of its own (a root: what caused it is linked, not parented),
with a link to each distinct appending span among its events; each handler call is a child of
it, linked to its event's appending span. :func:`batch` makes the batch span current and
remembers it (:func:`current`), so the code that calls handlers (``Dispatch``, lanes,
republishers) adds child spans only when a recording batch is there: with tracing off it pays
one context-variable read per batch.

Tracing is on when an OpenTelemetry SDK (any tracer provider but the API's default) is
installed; :func:`tracer` is None otherwise, and nothing else here runs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

from .propagation import add_to_encoded, event_context

# -- attribute names: the messaging conventions' where they fit, eventlanes.* for the rest ------
SYSTEM = "messaging.system"
OPERATION = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
PARTITION_ID = "messaging.destination.partition.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
MESSAGE_COUNT = "messaging.batch.message_count"
KAFKA_OFFSET = "messaging.kafka.offset"
PROCESSOR = "eventlanes.processor"
VERSION = "eventlanes.processor.version"
SEGMENT = "eventlanes.segment"
GUARANTEE = "eventlanes.guarantee"
POSITION = "eventlanes.position"  # a handler's event; a batch's first event
POSITION_LAST = "eventlanes.position.last"
TOKEN = "eventlanes.token"  # the position a batch moves its segment's token to
STREAM = "eventlanes.stream"
EVENT_TYPE = "eventlanes.event.type"
HANDLER = "eventlanes.handler"
REPLAY = "eventlanes.replay"
OUTCOME = "eventlanes.outcome"
KEY = "eventlanes.key"
REASON = "eventlanes.dead_letter.reason"
INGESTOR = "eventlanes.ingestor"
ENGINE = "eventlanes.engine"
PUSHDOWN = "eventlanes.pushdown"

SYSTEM_NAME = "eventlanes"
_ROOT = otel_context.Context()  # batches start traces of their own, linked to their causes
_cached: tuple[Any, Tracer | None] = (None, None)
_current: contextvars.ContextVar[Batch | None] = contextvars.ContextVar(
    "eventlanes_batch", default=None
)


def tracer() -> Tracer | None:
    """eventlanes' tracer when an SDK is installed (a tracer provider was set), else None."""
    global _cached
    provider = trace.get_tracer_provider()
    cached_provider, found = _cached
    if provider is not cached_provider:
        off = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
        found = None if off else provider.get_tracer("eventlanes")
        _cached = (provider, found)
    return found


def links(events: Iterable[Any]) -> list[Link]:
    """One link per distinct appending span among ``events`` (in order of first use)."""
    seen: dict[tuple[int, int], Link] = {}
    for event in events:
        ctx = event_context(event)
        if ctx is not None and (ctx.trace_id, ctx.span_id) not in seen:
            seen[ctx.trace_id, ctx.span_id] = Link(ctx)
    return list(seen.values())


def record(span: Span, exc: BaseException, description: str | None = None) -> None:
    """Record ``exc`` on ``span`` and mark it failed (once: a status already set stays)."""
    if not span.is_recording():
        return
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, description or f"{type(exc).__name__}: {exc}"))


def failed(exc: BaseException, description: str | None = None) -> None:
    """Record ``exc`` on the current batch span, if one is recording."""
    batch = _current.get()
    if batch is not None:
        record(batch.span, exc, description)
        batch.failed = True


def _name(handler: Any) -> str:
    return getattr(handler, "__qualname__", None) or type(handler).__name__


@dataclass(eq=False)
class Batch:
    """A recording batch span, and what its children repeat (processor, segment, guarantee)."""

    tracer: Tracer
    span: Span
    base: dict[str, Any]
    failed: bool = field(default=False)
    #: what every child span repeats: processor, segment, guarantee (and version)
    child: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.child = {k: v for k, v in self.base.items() if k.startswith("eventlanes.")}

    @contextmanager
    def handler(self, event: Any, handler: Any, replay: bool = False) -> Iterator[Span]:
        """A handler call for ``event``: a child of the batch, linked to its appending span."""
        ctx = event_context(event)
        # Few attributes: the SDK checks each one (about 2 us apiece), and a span per handler
        # call is the main cost of tracing; the batch span has the rest.
        attributes = {
            **self.child,
            POSITION: event.position,
            STREAM: event.stream_id,
            EVENT_TYPE: event.type,
            HANDLER: _name(handler),
        }
        if replay:
            attributes[REPLAY] = True
        with self.tracer.start_as_current_span(
            f"handle {event.type}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=[Link(ctx)] if ctx is not None else None,
        ) as span:
            yield span

    @contextmanager
    def batch_handler(self, handler: Any, events: Sequence[Any]) -> Iterator[Span]:
        """An ``on_batch`` handler call: linked to the appending spans of its events."""
        attributes = {**self.child, HANDLER: _name(handler), MESSAGE_COUNT: len(events)}
        if events:
            attributes[POSITION] = events[0].position
            attributes[POSITION_LAST] = events[-1].position
        with self.tracer.start_as_current_span(
            "handle batch", kind=SpanKind.INTERNAL, attributes=attributes, links=links(events)
        ) as span:
            yield span

    def parked(self, event: Any, key: str | None, reason: str) -> None:
        """A dead letter parked: a span of its own, linked to the event's appending span."""
        ctx = event_context(event)
        attributes = {**self.child, POSITION: event.position, STREAM: event.stream_id,
                      EVENT_TYPE: event.type, REASON: reason[:1000]}  # fmt: skip
        if key is not None:
            attributes[KEY] = key
        self.tracer.start_span(
            f"park {self.base.get(PROCESSOR, '')}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=[Link(ctx)] if ctx is not None else None,
        ).end()

    def commit(self, token: int | None = None) -> Span:
        """A commit in this batch (:func:`commit`)."""
        return commit(self.tracer, self.base, token)


def commit(tracer: Tracer, base: dict[str, Any], token: int | None = None) -> Span:
    """A commit (handlers' writes, states and the token), child of the current span, started
    now: the caller ends it (:func:`ended`)."""
    attributes = {**base, OPERATION: "commit", OPERATION_TYPE: "settle"}
    if token is not None:
        attributes[TOKEN] = token
    return tracer.start_span(
        f"commit {base.get(PROCESSOR, '')}", kind=SpanKind.INTERNAL, attributes=attributes
    )


def current() -> Batch | None:
    """The recording batch this code runs in, or None (tracing off, or not sampled)."""
    return _current.get()


def base_attributes(
    processor: str, segment: Any = None, guarantee: str | None = None, version: Any = None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        SYSTEM: SYSTEM_NAME,
        PROCESSOR: processor,
        CONSUMER_GROUP: processor,
    }
    if segment is not None:
        attributes[SEGMENT] = str(segment)
    if guarantee is not None:
        attributes[GUARANTEE] = guarantee
    if isinstance(version, int) and not isinstance(version, bool):
        attributes[VERSION] = version
    return attributes


@contextmanager
def batch(
    tracer: Tracer,
    operation: str,
    base: dict[str, Any],
    events: Sequence[Any] = (),
    count: int | None = None,
    first: int | None = None,
    last: int | None = None,
    token: int | None = None,
    root: bool = True,
    extra: dict[str, Any] | None = None,
) -> Iterator[Span]:
    """A batch span ``"{operation} {processor}"`` (``CONSUMER``), current while the block
    runs, linked to the appending spans of ``events`` (links are added once it is known to
    record: a batch that is not sampled reads no metadata). ``root``: start a trace of its
    own (processing batches); else a child of the current span (a retry asked for by a
    caller, a Spark job). An exception leaving the block is recorded on it."""
    attributes = {**base, OPERATION: operation, OPERATION_TYPE: "process"}
    n = len(events) if count is None else count
    attributes[MESSAGE_COUNT] = n
    if first is None and events:
        first, last = events[0].position, events[-1].position
    if first is not None:
        attributes[POSITION] = first
    if last is not None:
        attributes[POSITION_LAST] = last
    if token is not None:
        attributes[TOKEN] = token
    if extra:
        attributes.update(extra)
    span = tracer.start_span(
        f"{operation} {base.get(PROCESSOR, '')}".rstrip(),
        context=_ROOT if root else None,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
    recording = span.is_recording()
    if recording:
        for link in links(events):
            span.add_link(link.context)
    state = Batch(tracer, span, base) if recording else None
    reset = _current.set(state)
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield span
    except BaseException as exc:
        if state is None or not state.failed:
            record(span, exc)
        raise
    finally:
        _current.reset(reset)
        span.end()


def ended(span: Span | None, exc: BaseException | None = None) -> None:
    """End a span started with :meth:`Batch.commit` (recording ``exc`` if it failed)."""
    if span is None:
        return
    if exc is not None:
        record(span, exc)
    span.end()


@contextmanager
def producer(tracer: Tracer, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    """A ``PRODUCER`` span (an append, a Kafka publish), child of the current span."""
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield span


_api_tracer = trace.get_tracer("eventlanes")  # the SDK's once one is set; else passes context


def append(
    stream_id: str,
    metadata: Sequence[Any],
    encoded: list[tuple[str, str, str]],
    run: Callable[[], list[int]],
) -> list[int]:
    """An append under a sampled span: a ``PRODUCER`` span ``append``, child of the caller's,
    whose context is written into the events' metadata before ``run`` stores them."""
    attributes: dict[str, Any] = {
        SYSTEM: SYSTEM_NAME, OPERATION: "append", OPERATION_TYPE: "send",
        DESTINATION: stream_id, STREAM: stream_id, MESSAGE_COUNT: len(encoded),
    }  # fmt: skip
    with _api_tracer.start_as_current_span(
        "append", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        add_to_encoded(encoded, metadata, span)
        positions = run()
        if span.is_recording():
            span.set_attribute(POSITION, positions[0])
            span.set_attribute(POSITION_LAST, positions[-1])
        return positions
