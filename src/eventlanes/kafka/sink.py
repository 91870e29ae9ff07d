"""Publishing to a Kafka topic: at least once, in order per key, each record carrying its
source chain, the token committed only after the broker acknowledged.

``el.KafkaSink(kafka, "totals")`` is given to what publishes:

* ``app.publisher(name, sink, on=[types])``: a processor that publishes events (a projection
  or the outputs of a republisher) with an idempotent producer, one batch per segment, and
  commits its token after every record of the batch was acknowledged;
* ``app.aggregation(..., publish=sink)`` / ``agg.downstream(..., publish=sink)``: each state
  written is published (key: the aggregation key; value: the state) before the transaction
  that stores it and its token commits.

A crash after the broker's acknowledgement and before the token's commit publishes the same
records again on restart, with the same ``el-source-chain`` header: an eventlanes ingest on the
other side carries the chain on, and an aggregation there drops what it already folded (its
root coordinates are not newer). Kafka transactions would not close that window (the token
lives in our database, not in Kafka), so they are not used.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import InvalidInputError
from ..events import Event
from ..lineage import CHAIN_KEY
from ..tracing import propagation, spans
from . import client
from .records import CHAIN_HEADER, TYPE_HEADER
from .settings import Kafka, KafkaUnavailableError

Chain = list[dict[str, Any]]
Out = tuple[Any, dict[str, Any], Chain, list[tuple[str, bytes]]]  # key, value, chain, headers


def _bytes(value: Any, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidInputError(f"a Kafka {what} is str, bytes or None, got {type(value).__name__}")


class KafkaSink:
    """A topic to publish to; one idempotent producer per process, shared by its threads."""

    def __init__(self, kafka: Kafka, topic: str, *, ack_timeout: float = 30.0) -> None:
        from .ingestor import valid_topic

        if not isinstance(kafka, Kafka):
            raise InvalidInputError("KafkaSink needs the connection as el.Kafka(...)")
        self.kafka = kafka
        self.topic = valid_topic(topic, "sink")
        if not isinstance(ack_timeout, int | float) or ack_timeout <= 0:
            raise InvalidInputError(f"ack_timeout must be > 0 seconds, got {ack_timeout!r}")
        self.ack_timeout = float(ack_timeout)
        self._producer: Any = None
        self._pid = 0
        self._lock = threading.Lock()
        #: records acknowledged by this process (for tests and the demo)
        self.published = 0

    def producer(self) -> Any:
        """The sink's producer, made on first use (one per process)."""
        with self._lock:
            if self._producer is None or self._pid != os.getpid():  # not across a fork
                self._producer = client.producer(self.kafka)
                self._pid = os.getpid()
            return self._producer

    def publish(self, records: list[Out]) -> None:
        """Produce ``(key, value, chain, headers)`` records in order and wait until the broker
        has acknowledged every one; raises (nothing to commit) otherwise. When tracing is on,
        in a ``PRODUCER`` span ``publish {topic}`` whose context each record carries in its
        ``traceparent`` header (child of the handler or state write that publishes)."""
        if not records:
            return
        tracer = spans.tracer()
        if tracer is None:
            return self._publish(records, [])
        attributes = {spans.SYSTEM: "kafka", spans.OPERATION: "publish",
                      spans.OPERATION_TYPE: "send", spans.DESTINATION: self.topic,
                      spans.MESSAGE_COUNT: len(records)}  # fmt: skip
        with spans.producer(tracer, f"publish {self.topic}", attributes) as span:
            trace_headers = propagation.inject_headers(span) if span.is_recording() else []
            return self._publish(records, trace_headers)

    def _publish(self, records: list[Out], trace_headers: list[tuple[str, bytes]]) -> None:
        producer = self.producer()
        failed: list[str] = []
        pending = [len(records)]

        def done(err: Any, _msg: Any) -> None:
            pending[0] -= 1
            if err is not None:
                failed.append(err.str())

        for key, value, chain, headers in records:
            head = [*headers, (CHAIN_HEADER, json.dumps(chain, separators=(",", ":")).encode()),
                    *trace_headers]  # fmt: skip
            payload = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
            while True:
                try:
                    producer.produce(self.topic, payload, _bytes(key, "key"), headers=head,
                                     on_delivery=done)  # fmt: skip
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
        deadline = time.monotonic() + self.ack_timeout
        while pending[0] > 0 and time.monotonic() < deadline:
            producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if failed or pending[0] > 0:
            what = (
                failed[0] if failed else f"{pending[0]} not acknowledged in {self.ack_timeout:g} s"
            )
            raise KafkaUnavailableError(
                f"publishing to Kafka topic {self.topic!r} failed ({what}); the batch is retried"
            )
        with self._lock:
            self.published += len(records)

    def __repr__(self) -> str:
        return f"KafkaSink({self.topic!r}, {self.kafka!r})"


def event_chain(event: Event, source: str) -> Chain:
    """The chain a published event carries: its own, plus a hop for it."""
    chain = list(event.metadata.get(CHAIN_KEY) or []) if event.metadata else []
    chain.append({"source": event.source or source, "partition": "", "offset": event.position,
                  "out": 0})  # fmt: skip
    return chain


KeyOf = Callable[[Event], Any]
ValueOf = Callable[[Event], dict[str, Any]]


def event_records(
    events: list[Event], source: str, key: KeyOf | None, value: ValueOf | None
) -> list[Out]:
    records = []
    for e in events:
        k = e.stream_id if key is None else key(e)
        v = e.data if value is None else value(e)
        if not isinstance(v, dict):
            raise InvalidInputError(f"value() gave {type(v).__name__} for event {e.position}, "
                                    "not a dict")  # fmt: skip
        records.append((k, v, event_chain(e, source), [(TYPE_HEADER, e.type.encode())]))
    return records
