"""Trace context in and out of events and Kafka records (W3C Trace Context).

An append made under a sampled span writes that context into each event's metadata:
``traceparent`` (``00-<trace id>-<span id>-<flags>``) and ``tracestate`` when the span has one.
An event whose metadata already names either key keeps what it says (a Kafka ingest copies the
record's header there, a republisher its mapping's span; a user may set their own). Kafka
records carry the same two keys as headers.

The append hot path pays one context lookup when no span is active: :func:`sampled` returns
None at once. Everything else here runs only when tracing is on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
KEYS = (TRACEPARENT, TRACESTATE)

_propagator = TraceContextTextMapPropagator()
_current_span = trace.get_current_span


def sampled() -> Span | None:
    """The current span when its context is valid and sampled (what an append records), else
    None. A context that is not sampled is not recorded: nothing downstream would be kept."""
    span = _current_span()
    if span is INVALID_SPAN:
        return None
    ctx = span.get_span_context()
    if not (ctx.is_valid and ctx.trace_flags.sampled):
        return None
    return span


def fields(span: Span) -> dict[str, str]:
    """``{"traceparent": ..., "tracestate": ...}`` of ``span`` (tracestate only if set)."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return {k: carrier[k] for k in KEYS if k in carrier}


def add_to_encoded(
    encoded: list[tuple[str, str, str]], metadata: Sequence[Mapping[str, Any]], span: Span
) -> None:
    """Write ``span``'s context into the JSON text of each encoded event's metadata (in place),
    unless the event's ``metadata`` already names a trace key. Done after the append's
    validation: the keys added are plain ASCII JSON."""
    context = fields(span)
    if not context:
        return
    text = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in context.items())
    for i, (type_, data, meta) in enumerate(encoded):
        given = metadata[i]
        if given and (TRACEPARENT in given or TRACESTATE in given):
            continue
        encoded[i] = (type_, data, "{" + text + ("}" if meta == "{}" else "," + meta[1:]))


def context_of(carrier: Mapping[str, Any] | None) -> SpanContext | None:
    """The (remote) span context a metadata dict or a header mapping carries, or None when it
    has none or a malformed one (never raises)."""
    if not carrier:
        return None
    parent = carrier.get(TRACEPARENT)
    if not isinstance(parent, str):
        return None
    state = carrier.get(TRACESTATE)
    return _parsed(parent, state if isinstance(state, str) else None)


@lru_cache(maxsize=4096)  # a batch's events share few appends: each is parsed once
def _parsed(parent: str, state: str | None) -> SpanContext | None:
    found = {TRACEPARENT: parent} if state is None else {TRACEPARENT: parent, TRACESTATE: state}
    ctx = trace.get_current_span(_propagator.extract(found)).get_span_context()
    return ctx if ctx.is_valid else None


def event_context(event: Any) -> SpanContext | None:
    """The context an event's metadata carries (None for none, or for corrupt metadata)."""
    try:
        metadata = event.metadata
    except Exception:  # noqa: BLE001 - a corrupt event: the handlers report it, not tracing
        return None
    return context_of(metadata) if metadata else None


def header_fields(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """The trace keys of Kafka record headers (last value wins), decoded; only when the
    ``traceparent`` is a valid one."""
    found: dict[str, str] = {}
    for key, raw in headers:
        if key in KEYS and raw is not None:
            try:
                found[key] = raw.decode("ascii")
            except UnicodeDecodeError:
                return {}
    if context_of(found) is None:
        return {}
    return found


def inject_headers(span: Span) -> list[tuple[str, bytes]]:
    """Kafka headers carrying ``span``'s context."""
    return [(k, v.encode()) for k, v in fields(span).items()]
