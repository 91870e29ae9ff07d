"""OpenTelemetry tracing: from the code that appended an event to every handler that ran it.

* ``append`` under a sampled span records that span's context in each event's metadata (W3C
  ``traceparent``, and ``tracestate`` when set), in a ``PRODUCER`` span ``append``; the store
  URL option ``trace=off`` turns that off (:mod:`.propagation`).
* Processing runs in spans linked to the appending spans (:mod:`.spans`): a batch span per
  segment batch, a child per handler call, dead-letter parking and retry, commits, Kafka
  publish and ingest (the trace keys travel as record headers), one span per Spark job.
* Only the OpenTelemetry API is a dependency of eventlanes: without an SDK nothing is
  recorded and processing pays one check per batch. Install ``eventlanes[tracing]`` and either
  set up the SDK in your app module, or let ``eventlanes run`` (and ``replay``,
  ``dead-letters``) set it up from the standard ``OTEL_*`` environment variables
  (:func:`configure_from_env`).
"""

from __future__ import annotations

from .propagation import TRACEPARENT, TRACESTATE, context_of, event_context
from .setup import configure_from_env, shutdown

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "configure_from_env",
    "context_of",
    "event_context",
    "shutdown",
]
