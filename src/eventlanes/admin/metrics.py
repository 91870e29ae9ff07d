"""Prometheus metrics: an :class:`~eventlanes.observe.Observer` that counts what the runners
report, and a collector that computes lag when scraped.

* :class:`PrometheusObserver`: counters and histograms updated on the processing threads
  (events handled, handler and commit seconds, failures, dead letters parked, claims held,
  worker restarts).
* :class:`StatusCollector`: at scrape time reads the token store, the dead-letter table and the
  event store: lag in events and in seconds (age of the oldest unhandled event) to the
  committed head, positions, consecutive errors, dead letters waiting, and the open
  transaction readers wait behind (PostgreSQL). Computed once per scrape, never on the hot
  path.

With ``run --processes N`` each worker writes its values to files in a directory the supervisor
made (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``); the supervisor serves
their sum plus one :class:`StatusCollector`, so one scrape sees every worker.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ..observe import Observer
from .health import segment_lag_seconds, store_first_after

if TYPE_CHECKING:
    from ..store import EventStore
    from .views import ProcessorView


class Inspected(Protocol):
    """What the status collector reads (an ``App`` is one): the store, the processors' names
    and their status."""

    @property
    def store(self) -> EventStore: ...

    @property
    def processors(self) -> Mapping[str, object]: ...

    def status(self, name: str) -> ProcessorView: ...

    @property
    def ingestors(self) -> Mapping[str, object]: ...

    def ingest_status(self, name: str) -> Any: ...


log = logging.getLogger("eventlanes.admin.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LABELS = ("processor", "segment")


class PrometheusObserver(Observer):
    """Counts what the runners report. ``registry=None`` registers nowhere (multiprocess
    workers: values go to the files the supervisor reads)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry
        reg: Any = registry
        self.handled = Counter(
            "eventlanes_events_handled",
            "Events whose handlers ran and whose token was committed",
            LABELS, registry=reg,
        )  # fmt: skip
        self.handler_seconds = Histogram(
            "eventlanes_handler_batch_seconds",
            "Seconds the handlers took for one segment's batch (before its commit)",
            LABELS, registry=reg,
        )  # fmt: skip
        self.commit_seconds = Histogram(
            "eventlanes_commit_seconds",
            "Seconds one segment's commit took (handler writes + token, one transaction)",
            LABELS, registry=reg,
        )  # fmt: skip
        self.failures = Counter(
            "eventlanes_batch_failures",
            "Batches that failed (handler or database); each is retried after a back-off",
            LABELS, registry=reg,
        )  # fmt: skip
        self.parked_events = Counter(
            "eventlanes_dead_letters_parked",
            "Events parked as dead letters",
            LABELS, registry=reg,
        )  # fmt: skip
        self.claims_held = Gauge(
            "eventlanes_claims_held",
            "Segments of the processor held by the running workers",
            ("processor",), registry=reg, multiprocess_mode="livesum",
        )  # fmt: skip
        self.restarts = Counter(
            "eventlanes_worker_restarts",
            "Worker processes replaced by the supervisor after an abnormal exit",
            ("worker",), registry=reg,
        )  # fmt: skip

    def batch_handled(
        self, processor: str, segment: str, events: int, handler_seconds: float
    ) -> None:
        if events:
            self.handled.labels(processor, segment).inc(events)
        self.handler_seconds.labels(processor, segment).observe(handler_seconds)

    def committed(self, processor: str, segment: str, seconds: float) -> None:
        self.commit_seconds.labels(processor, segment).observe(seconds)

    def failed(self, processor: str, segment: str, error: str) -> None:
        self.failures.labels(processor, segment).inc()

    def parked(self, processor: str, segment: str, events: int) -> None:
        self.parked_events.labels(processor, segment).inc(events)

    def claims(self, processor: str, held: int) -> None:
        self.claims_held.labels(processor).set(held)

    def worker_restarted(self, worker: str) -> None:
        self.restarts.labels(worker).inc()


class StatusCollector(Collector):
    """Per processor and segment, read at scrape time: lag (events, seconds), position, head,
    consecutive errors, dead letters waiting. ``eventlanes_status_up`` is 0 when the read
    failed (database down), so an alert can tell "no lag" from "no data"."""

    def __init__(self, app: Inspected, processors: list[str] | None = None) -> None:
        self.app = app
        self.names = processors
        self._lock = threading.Lock()  # one scrape at a time reads the database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def family(name: str, doc: str, labels: tuple[str, ...] = LABELS) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        lag = family("eventlanes_lag_events", "Events between the head and the segment's token")
        lag_s = family(
            "eventlanes_lag_seconds",
            "Age of the oldest unhandled event of the segment (0 when caught up)",
        )
        position = family("eventlanes_position", "The segment's token position")
        errors = family(
            "eventlanes_segment_errors", "Consecutive failed attempts of the segment (0: healthy)"
        )
        head = family("eventlanes_head_position", "The event store's committed head position", ())
        readable = family(
            "eventlanes_readable_head_position",
            "The highest position readers can read now (below the head while they wait)",
            (),
        )
        waiting = family(
            "eventlanes_read_wait_seconds",
            "Age of the open transaction readers wait behind (present only while they wait)",
            ("pid", "application_name"),
        )
        letters = family(
            "eventlanes_dead_letters", "Dead letters waiting for retry or discard", ("processor",)
        )
        serving = family(
            "eventlanes_version_serving",
            "1 for the version of its processor that readers see, 0 for the others",
            ("processor",),
        )
        behind = family(
            "eventlanes_version_behind_events",
            "Positions a version is behind the serving version of its processor",
            ("processor",),
        )
        up = family("eventlanes_status_up", "1 if the last status read succeeded", ())
        kafka = _KafkaFamilies()
        ok = 1.0
        with self._lock:
            try:
                now = datetime.now(UTC)
                first_after = store_first_after(self.app.store)
                wait = self.app.store.read_wait()
                store_head = wait.committed if wait is not None else self.app.store.committed_head()
                head.add_metric([], store_head)
                readable.add_metric([], wait.readable if wait is not None else store_head)
                if wait is not None:
                    labels = [str(wait.pid or ""), wait.application_name or ""]
                    waiting.add_metric(labels, wait.age)
                ingestors = getattr(self.app, "ingestors", {})
                for name in self.names or list(ingestors):
                    if name in ingestors:
                        kafka.add(self.app.ingest_status(name), letters)
                for name in self.names or list(self.app.processors):
                    if name in ingestors:
                        continue
                    view = self.app.status(name)
                    letters.add_metric([name], view.dead_letters)
                    if view.version is not None:
                        serving.add_metric([name], float(view.version.serving))
                        if view.version.behind is not None:
                            behind.add_metric([name], view.version.behind)
                    for s in view.segments:
                        labels = [name, str(s.segment)]
                        lag.add_metric(labels, s.lag)
                        lag_s.add_metric(
                            labels, segment_lag_seconds(first_after, s, view.head, now)
                        )
                        position.add_metric(labels, s.position)
                        errors.add_metric(labels, s.errors)
            except Exception as exc:  # noqa: BLE001 - a scrape must answer, even without data
                log.warning("metrics: reading the status failed: %s", exc)
                ok = 0.0
        up.add_metric([], ok)
        yield from (
            lag,
            lag_s,
            position,
            errors,
            head,
            readable,
            waiting,
            letters,
            serving,
            behind,
            up,
            *kafka.families,
        )


class _KafkaFamilies:
    """Per ingestor and partition: position (next offset), the broker's high watermark as last
    fetched, the lag between them, consecutive errors."""

    def __init__(self) -> None:
        labels = ["ingestor", "partition"]
        self.position = GaugeMetricFamily(
            "eventlanes_kafka_position",
            "The partition's token: the next offset to append",
            labels=labels,
        )
        self.high = GaugeMetricFamily(
            "eventlanes_kafka_high_watermark", "The partition's high watermark, as last fetched",
            labels=labels,
        )  # fmt: skip
        self.lag = GaugeMetricFamily(
            "eventlanes_kafka_lag_records", "High watermark minus position", labels=labels
        )
        self.errors = GaugeMetricFamily(
            "eventlanes_kafka_partition_errors", "Consecutive failed attempts (0: healthy)",
            labels=labels,
        )  # fmt: skip
        self.families = (self.position, self.high, self.lag, self.errors)

    def add(self, view: Any, letters: GaugeMetricFamily) -> None:
        letters.add_metric([view.name], view.dead_letters)
        for p in view.partitions:
            labels = [view.name, str(p.partition)]
            self.position.add_metric(labels, p.position)
            self.errors.add_metric(labels, p.errors)
            if p.high_watermark is not None:
                self.high.add_metric(labels, p.high_watermark)
                self.lag.add_metric(labels, p.lag)


class _WorkerFiles(Collector):
    """prometheus-client's sum of the workers' files, read again when a worker was creating
    one at that moment (a file still empty fails to parse: ``struct.error``; an HTTP 500)."""

    def __init__(self) -> None:
        self.files = MultiProcessCollector(None)

    def collect(self) -> Iterator[Any]:
        for attempt in range(5):
            try:
                return iter(list(self.files.collect()))
            except struct.error:
                if attempt == 4:
                    raise
                time.sleep(0.01)
        raise AssertionError("unreachable")


def registry_for(
    app: Inspected,
    observer: PrometheusObserver | None = None,
    processors: list[str] | None = None,
) -> CollectorRegistry:
    """What one scrape returns: this process's observer (or, in multiprocess mode, the sum of
    the workers' files) plus the status collector."""
    if observer is not None and observer.registry is not None:
        registry = observer.registry
    else:
        registry = CollectorRegistry()
        if os.environ.get(MULTIPROC_ENV):
            registry.register(_WorkerFiles())
    registry.register(StatusCollector(app, processors))
    return registry


class MetricsServer:
    """``/metrics`` over HTTP (prometheus-client's own server) in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> None:
        self.server, self.thread = start_http_server(port, addr=addr, registry=registry)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
