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
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ..errors import InvalidInputError
from ..kafka import status as kafka_status
from ..observe import Observer
from .health import segment_lag_seconds, store_first_after
from .status import status
from .versions import defined_versions
from .views import measured_head

if TYPE_CHECKING:
    from ..processing.processor import Processor
    from ..processing.runtime import Runtime
    from ..store.base import ReadWait
    from .health import FirstAfter
    from .views import ProcessorView


class Watched(Protocol):
    """What the status collector reads: the runtime and the definitions of the processors and
    ingestors it reports on (an ``App`` holds them). It builds their views itself
    (:func:`eventlanes.admin.status.status`, :func:`eventlanes.kafka.status.view`)."""

    @property
    def runtime(self) -> Runtime: ...

    @property
    def processors(self) -> Mapping[str, Processor]: ...

    @property
    def ingestors(self) -> Mapping[str, object]: ...


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

    def __init__(self, watched: Watched, processors: list[str] | None = None) -> None:
        self.watched = watched
        self.names = processors
        self._lock = threading.Lock()  # one scrape at a time reads the database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = _StoreFamilies()
        procs = _ProcessorFamilies()
        kafka = _KafkaFamilies()
        up = GaugeMetricFamily("eventlanes_status_up", "1 if the last status read succeeded",
                               labels=[])  # fmt: skip
        ok = 1.0
        with self._lock:
            try:
                self._read(store, procs, kafka)
            except Exception as exc:  # noqa: BLE001 - a scrape must answer, even without data
                log.warning("metrics: reading the status failed: %s", exc)
                ok = 0.0
        up.add_metric([], ok)
        yield from (*procs.segment_families, *store.families, *procs.processor_families, up,
                    *kafka.families)  # fmt: skip

    def _read(
        self, store: _StoreFamilies, procs: _ProcessorFamilies, kafka: _KafkaFamilies
    ) -> None:
        rt = self.watched.runtime
        now = datetime.now(UTC)
        first_after = store_first_after(rt.store)
        store.add(rt.store.read_wait(), rt.store.committed_head)
        ingestors = self.watched.ingestors
        for name in self.names or list(ingestors):
            if name in ingestors:
                kafka.add(kafka_status.view(rt.db, name, rt.claim_timeout), procs.letters)
        definitions = self.watched.processors
        for name in self.names or list(definitions):
            if name in ingestors:
                continue
            proc = definitions.get(name)
            if proc is None:
                raise InvalidInputError(f"unknown processor {name!r}")
            defined = defined_versions(definitions.values(), proc.base)
            procs.add(status(rt, proc, defined), first_after, now)


def _family(name: str, doc: str, labels: tuple[str, ...] = LABELS) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _StoreFamilies:
    """The event store's committed and readable heads, and the transaction readers wait behind
    (PostgreSQL)."""

    def __init__(self) -> None:
        self.head = _family(
            "eventlanes_head_position", "The event store's committed head position", ()
        )
        self.readable = _family(
            "eventlanes_readable_head_position",
            "The highest position readers can read now (below the head while they wait)",
            (),
        )
        self.waiting = _family(
            "eventlanes_read_wait_seconds",
            "Age of the open transaction readers wait behind (present only while they wait)",
            ("pid", "application_name"),
        )
        self.families = (self.head, self.readable, self.waiting)

    def add(self, wait: ReadWait | None, committed_head: Callable[[], int]) -> None:
        head = measured_head(wait, committed_head)
        self.head.add_metric([], head)
        self.readable.add_metric([], wait.readable if wait is not None else head)
        if wait is not None:
            self.waiting.add_metric([str(wait.pid or ""), wait.application_name or ""], wait.age)


class _ProcessorFamilies:
    """Per processor and segment: lag (events, seconds), position, consecutive errors; per
    processor: dead letters waiting (ingestors' too), whether its version serves and how far
    behind the serving one it is, duplicates an aggregation dropped."""

    def __init__(self) -> None:
        self.lag = _family(
            "eventlanes_lag_events", "Events between the head and the segment's token"
        )
        self.lag_s = _family(
            "eventlanes_lag_seconds",
            "Age of the oldest unhandled event of the segment (0 when caught up)",
        )
        self.position = _family("eventlanes_position", "The segment's token position")
        self.errors = _family(
            "eventlanes_segment_errors", "Consecutive failed attempts of the segment (0: healthy)"
        )
        self.letters = _family(
            "eventlanes_dead_letters", "Dead letters waiting for retry or discard", ("processor",)
        )
        self.serving = _family(
            "eventlanes_version_serving",
            "1 for the version of its processor that readers see, 0 for the others",
            ("processor",),
        )
        self.behind = _family(
            "eventlanes_version_behind_events",
            "Positions a version is behind the serving version of its processor",
            ("processor",),
        )
        self.dropped = _family(
            "eventlanes_duplicates_dropped",
            "Inputs an aggregation dropped as already folded in (by their source chain)",
            ("processor",),
        )
        self.dropped_by = _family(
            "eventlanes_duplicates_dropped_by_source",
            "Inputs an aggregation dropped as already folded in, by their root source",
            ("processor", "source"),
        )
        self.segment_families = (self.lag, self.lag_s, self.position, self.errors)
        self.processor_families = (self.letters, self.serving, self.behind, self.dropped,
                                   self.dropped_by)  # fmt: skip

    def add(self, view: ProcessorView, first_after: FirstAfter, now: datetime) -> None:
        name = view.name
        self.letters.add_metric([name], view.dead_letters)
        if view.dropped is not None:  # aggregations only: a surge of drops is seen
            self.dropped.add_metric([name], view.dropped)
            for source, n in (view.dropped_by or {}).items():
                self.dropped_by.add_metric([name, source], n)
        if view.version is not None:
            self.serving.add_metric([name], float(view.version.serving))
            if view.version.behind is not None:
                self.behind.add_metric([name], view.version.behind)
        for s in view.segments:
            labels = [name, str(s.segment)]
            self.lag.add_metric(labels, s.lag)
            self.lag_s.add_metric(labels, segment_lag_seconds(first_after, s, view.head, now))
            self.position.add_metric(labels, s.position)
            self.errors.add_metric(labels, s.errors)


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
    """prometheus-client's sum of the workers' files, without the files still empty: a worker
    creates its file empty and sizes it next, and an empty file fails to parse
    (``struct.error``, an HTTP 500 to the scraper). An empty file holds no value yet, so the
    sum without it is the sum at that moment; a sized file always parses (its header counts
    what is written, and is written last)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterator[Any]:
        files = []
        for entry in os.scandir(self.path):
            if not entry.name.endswith(".db"):
                continue
            try:
                if entry.stat().st_size > 0:
                    files.append(entry.path)
            except FileNotFoundError:  # a dead worker's file removed meanwhile
                continue
        return iter(MultiProcessCollector.merge(files, accumulate=True))


def registry_for(
    watched: Watched,
    observer: PrometheusObserver | None = None,
    processors: list[str] | None = None,
) -> CollectorRegistry:
    """What one scrape returns: this process's observer (or, in multiprocess mode, the sum of
    the workers' files) plus the status collector of ``watched``'s processors and ingestors
    (``processors``: these names only)."""
    if observer is not None and observer.registry is not None:
        registry = observer.registry
    else:
        registry = CollectorRegistry()
        if os.environ.get(MULTIPROC_ENV):
            registry.register(_WorkerFiles(os.environ[MULTIPROC_ENV]))
    registry.register(StatusCollector(watched, processors))
    return registry


class MetricsServer:
    """``/metrics`` over HTTP (prometheus-client's own server) in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> None:
        self.server, self.thread = start_http_server(port, addr=addr, registry=registry)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
