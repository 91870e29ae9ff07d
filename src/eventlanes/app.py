"""The App: an event store, its token store, and the processors that consume it.

Nothing connects when an App is defined (modules that define one are imported by the CLI and by
worker processes); the store is opened on first use. The App is the façade: it defines
processors and builds the :class:`~eventlanes.processing.runtime.Runtime` that the runners,
admin commands and the Spark pipeline work with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from .admin import control, dead_letters, reset, status
from .admin import versions as lifecycle
from .admin.reset import ResetPlan
from .admin.views import ProcessorView
from .db import Database
from .errors import InvalidInputError, ProcessorCrashedError, StopTimeoutError
from .events import Event
from .kafka.ingestor import Ingestor, OnBad
from .kafka.records import DEFAULT_MAX_BYTES, Record
from .kafka.settings import Kafka
from .names import split_version, validate_base_name, validate_processor_name
from .observe import Observer
from .policies import KeyFunction, SequencingPolicy
from .processing.aggregating.aggregation import Aggregation
from .processing.aggregating.declarative import Op
from .processing.handling.context import check_table_name
from .processing.handling.failures import describe_crash
from .processing.options import OrderKey
from .processing.processor import Processor
from .processing.republisher import Republisher
from .processing.running import requests
from .processing.running.balance import Balancer, balance
from .processing.running.runner import ProcessorRunner, unless_crashed
from .processing.runtime import Runtime
from .processing.tables.dead_letters import DeadLetter, DeadLetterStore
from .processing.tables.states import StateTable
from .schema import Migrated
from .signals import run_until_signal
from .store import EventStore
from .store.notify import Wakeup, wakeup_for
from .tokens import DEFAULT_CLAIM_TIMEOUT, TokenStore
from .tokens.base import Initial
from .tokens.claims import node_name
from .upcasting import Upcasters


class App:
    """``el.App("sqlite:///shop.db")``: the store URL; the token store defaults to the same
    database, so projections written with ``ctx.execute`` commit together with their tokens."""

    def __init__(
        self,
        url: str,
        *,
        token_store: str | TokenStore | None = None,
        claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
        poll_interval: float | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.runtime = Runtime(
            url,
            token_store=token_store,
            claim_timeout=claim_timeout,
            poll_interval=poll_interval,
            observer=observer,
        )
        self.processors: dict[str, Processor] = {}
        self.ingestors: dict[str, Ingestor] = {}
        self._ingest_runners: list[Any] = []
        self._runners: list[ProcessorRunner] = []
        self._balancers: list[Balancer] = []
        self._metrics: Any = None  # the metrics HTTP server while running
        self._wakeup: Wakeup | None = None
        self._stop = threading.Event()

    # -- resources (opened by the runtime on first use) ----------------------------------------
    @property
    def url(self) -> str:
        """The store's URL, as given."""
        return self.runtime.url

    @property
    def claim_timeout(self) -> float:
        """Seconds a dead node's segments wait before another node takes them."""
        return self.runtime.claim_timeout

    @property
    def poll_interval(self) -> float | None:
        """Seconds between looks for new events when not notified (None: the default)."""
        return self.runtime.poll_interval

    @property
    def store(self) -> EventStore:
        """The event store (opened on first use)."""
        return self.runtime.store

    @property
    def db(self) -> Database:
        """The store's database: ``app.db.table(name)``, ``query``, ``run_ddl``, ``transaction`` for
        your own tables."""
        return self.runtime.db

    @property
    def tokens(self) -> TokenStore:
        """The token store (by default in the store's own database)."""
        return self.runtime.tokens

    @property
    def dead_letters(self) -> DeadLetterStore:
        """The table of parked events (:meth:`dead_letter_list`, the CLI's ``dead-letters``)."""
        return self.runtime.dead_letters

    @property
    def aggregate_states(self) -> StateTable:
        """The table of aggregation states (``agg.get(key)`` reads one)."""
        return self.runtime.states

    def migrate(self) -> list[Migrated]:
        """Create or upgrade the tables of the app's store (and of its token store when that
        is another database) with this role, as ``eventlanes migrate URL`` does; then a role
        with SELECT, INSERT, UPDATE and DELETE only runs the app. Returns what each database
        had and which migrations were applied (none when current)."""
        return self.runtime.migrate()

    def source_store(self, target: str | EventStore) -> EventStore:
        """An extra source of a multi-source processor, opened once per app."""
        return self.runtime.source_store(target)

    # -- definition ----------------------------------------------------------------------------
    def processor(
        self,
        name: str,
        *,
        guarantee: str = "exactly-once",
        segments: int = 1,
        policy: SequencingPolicy | KeyFunction | None = None,
        batch_size: int = 500,
        mode: str = "pooled",
        max_segments: int | None = None,
        workers: int | None = None,
        on_error: str = "retry",
        initial: Initial = "tail",
        sources: dict[str, Any] | None = None,
        order: OrderKey | None = None,
        lanes: int = 1,
        handler_timeout: float = 30.0,
        lane_window: int | None = None,
        pipeline: bool = False,
        version: int = 1,
        tables: list[str] | tuple[str, ...] = (),
    ) -> Processor:
        """Define a processor; see :class:`eventlanes.processing.processor.Processor`.
        ``guarantee="exactly-once"`` (default: handlers' writes commit with the token) or
        ``"at-least-once"`` (handlers outside the transaction, e.g. ``lanes=K`` of async I/O).
        ``version=N``: a new version of processor ``name``, beside the earlier ones, with
        tokens and tables of its own (``eventlanes.admin.versions``); ``tables=[...]``: the tables
        its handlers build (``ctx.table`` names).

        ``segments``: the parts its events are split into, each in order (split and merged
        later by ``balance``); ``policy``: what is kept in order, an ``el.per_stream()``-like
        policy or ``event -> key`` (default: per stream); ``batch_size``: events per segment
        transaction at most; ``mode``: ``"pooled"`` (one reader per process) or
        ``"tracking"`` (one reader per segment); ``max_segments``: at most this many
        segments per process; ``workers``: the pooled mode's handler threads (default: one
        per segment); ``on_error``: ``"retry"`` the batch or ``"dead_letter"`` the failed
        event and the later ones of its key; ``initial``: where a new processor starts,
        ``"tail"`` (the first event), ``"head"``, a position or a time; ``sources``: other
        stores it also reads, ``{name: URL or store}``; ``order``: ``event -> key`` merging
        them (default: oldest first); ``lanes``: handler calls in flight per segment
        (at-least-once); ``handler_timeout``: seconds a handler call may take;
        ``lane_window``: events in flight in a segment's lanes (default 1000);
        ``pipeline``: PostgreSQL pipeline mode for exactly-once batches."""
        return self._add(
            Processor(
                self.runtime, name, guarantee=guarantee, segments=segments, policy=policy,
                batch_size=batch_size, mode=mode, max_segments=max_segments, workers=workers,
                on_error=on_error, initial=initial, sources=sources, order=order, lanes=lanes,
                handler_timeout=handler_timeout, lane_window=lane_window, pipeline=pipeline,
                version=version, tables=tables,
            )
        )  # fmt: skip

    def aggregation(
        self,
        name: str,
        *,
        key: Callable[[Event], Any] | str,
        initial: Callable[[], Any] | None = None,
        persist_every: float = 1.0,
        fields: dict[str, Op] | None = None,
        on: str | list[str] | None = None,
        pushdown: bool = True,
        publish: Any = None,
        segments: int = 1,
        batch_size: int = 500,
        mode: str = "pooled",
        max_segments: int | None = None,
        workers: int | None = None,
        on_error: str = "retry",
        sources: dict[str, Any] | None = None,
        order: OrderKey | None = None,
        lanes: int = 1,
        handler_timeout: float = 30.0,
        lane_window: int | None = None,
        pipeline: bool = False,
        version: int = 1,
        tables: list[str] | tuple[str, ...] = (),
    ) -> Aggregation:
        """An exactly-once aggregation (see ``eventlanes.processing.aggregating``): states by
        ``key`` (``event -> key``, or the name of a data property), each made by ``initial()``
        and updated by the folds of ``@agg.on(type)``, written every ``persist_every``
        seconds; or declared: ``fields={"n": el.count(), ...}`` over the events of types
        ``on``, folded inside SQLite where exact unless ``pushdown=False``; ``publish``: an
        :class:`eventlanes.kafka.KafkaSink` each written state is published to first. The
        other options are the processor's (:meth:`processor`); it routes by its key (no
        ``policy``) and its guarantee is ``"aggregation"`` (no ``guarantee``)."""
        return self._add(
            Aggregation(
                self.runtime, name, key=key, initial=initial, persist_every=persist_every,
                fields=fields, on=on, pushdown=pushdown, publish=publish, segments=segments,
                batch_size=batch_size, mode=mode, max_segments=max_segments, workers=workers,
                on_error=on_error, sources=sources, order=order, lanes=lanes,
                handler_timeout=handler_timeout, lane_window=lane_window, pipeline=pipeline,
                version=version, tables=tables,
            )
        )  # fmt: skip

    def republisher(
        self,
        name: str,
        *,
        to_stream: str | Callable[[Event], str],
        to_store: str | EventStore | None = None,
        segments: int = 1,
        policy: SequencingPolicy | KeyFunction | None = None,
        batch_size: int = 500,
        mode: str = "pooled",
        max_segments: int | None = None,
        workers: int | None = None,
        on_error: str = "retry",
        initial: Initial = "tail",
        sources: dict[str, Any] | None = None,
        order: OrderKey | None = None,
        lanes: int = 1,
        handler_timeout: float = 30.0,
        lane_window: int | None = None,
        pipeline: bool = False,
        version: int = 1,
        tables: list[str] | tuple[str, ...] = (),
    ) -> Republisher:
        """A processor appending derived events with their source chain; see
        :class:`eventlanes.processing.republisher.Republisher`. ``to_stream``: the stream
        they are appended to, a name or ``event -> name``; ``to_store``: another store (URL or
        store) to append to (default: the app's). The other options are the processor's
        (:meth:`processor`); its guarantee is ``"at-least-once"`` (no ``guarantee``)."""
        return self._add(
            Republisher(
                self.runtime, name, to_stream=to_stream, to_store=to_store, segments=segments,
                policy=policy, batch_size=batch_size, mode=mode, max_segments=max_segments,
                workers=workers, on_error=on_error, initial=initial, sources=sources,
                order=order, lanes=lanes, handler_timeout=handler_timeout,
                lane_window=lane_window, pipeline=pipeline, version=version, tables=tables,
            )
        )  # fmt: skip

    def ingest(
        self,
        name: str,
        kafka: Kafka,
        *,
        topic: str,
        stream: Callable[[Record], str] | None = None,
        type: str | Callable[[Record], str] | None = None,  # noqa: A002 - the user's word
        decode: Callable[[bytes | None], Any] | None = None,
        on_bad: OnBad = "stop",
        initial: Literal["earliest", "latest"] = "earliest",
        batch_size: int = 2000,
        max_record_bytes: int = DEFAULT_MAX_BYTES,
        max_partitions: int | None = None,
    ) -> Ingestor:
        """An ingestor appending the records of a Kafka ``topic`` to the store, exactly once
        (see :class:`eventlanes.kafka.Ingestor`, which describes its options: ``stream``,
        ``type`` and ``decode`` make a record an event, ``on_bad`` says what a bad record
        does, ``initial`` where a new partition starts, ``batch_size`` the records per
        transaction, ``max_record_bytes`` the largest record, ``max_partitions`` the
        partitions per process); ``run`` starts it like a processor. Its name shares the
        token table with the processors' names."""
        ingestor = Ingestor(
            self.runtime, name, kafka, topic=topic, stream=stream, type=type, decode=decode,
            on_bad=on_bad, initial=initial, batch_size=batch_size,
            max_record_bytes=max_record_bytes, max_partitions=max_partitions,
        )  # fmt: skip
        if name in self.processors or name in self.ingestors:
            raise InvalidInputError(f"{name!r} is already defined in this app")
        self.ingestors[name] = ingestor
        return ingestor

    def publisher(
        self,
        name: str,
        sink: Any,
        *,
        on: str | list[str] | None = None,
        key: Any = None,
        value: Any = None,
        guarantee: str = "exactly-once",
        segments: int = 1,
        policy: SequencingPolicy | KeyFunction | None = None,
        batch_size: int = 500,
        mode: str = "pooled",
        max_segments: int | None = None,
        workers: int | None = None,
        on_error: str = "retry",
        initial: Initial = "tail",
        sources: dict[str, Any] | None = None,
        order: OrderKey | None = None,
        lanes: int = 1,
        handler_timeout: float = 30.0,
        lane_window: int | None = None,
        pipeline: bool = False,
        version: int = 1,
        tables: list[str] | tuple[str, ...] = (),
    ) -> Processor:
        """A processor publishing events (of types ``on``; all by default) to a Kafka topic:
        ``sink`` is an :class:`eventlanes.kafka.KafkaSink`; record key ``key(event)`` (default:
        the stream id), value ``value(event)`` (default: the event's data), the event type
        in the ``type`` header and its source chain in ``el-source-chain``. Each segment
        batch is published and acknowledged before its token commits (at least once). The
        other options are the processor's (:meth:`processor`)."""
        from .kafka.sink import KafkaSink, event_records

        if not isinstance(sink, KafkaSink):
            raise InvalidInputError(f"publisher {name!r}: sink must be an el.KafkaSink")
        if version != 1:  # as republishers: it would run on history again
            raise InvalidInputError(
                f"publisher {name!r}: a second version of a publisher would publish all of "
                "history again (what version 1 handled is a replay it publishes): define a "
                "publisher of another name"
            )
        for what, fn in (("key", key), ("value", value)):
            if fn is not None and not callable(fn):
                raise InvalidInputError(f"publisher {name!r}: {what}= must be a function")
        types = [on] if isinstance(on, str) else list(on or [])
        proc = self.processor(
            name, guarantee=guarantee, segments=segments, policy=policy, batch_size=batch_size,
            mode=mode, max_segments=max_segments, workers=workers, on_error=on_error,
            initial=initial, sources=sources, order=order, lanes=lanes,
            handler_timeout=handler_timeout, lane_window=lane_window, pipeline=pipeline,
            version=version, tables=tables,
        )  # fmt: skip
        runtime = self.runtime

        @proc.on_batch(*types)
        def publish(events: list[Any], ctx: Any) -> None:
            sink.publish(event_records(events, runtime.store.events_table, key, value))

        return proc

    def upcaster(
        self, type: str, *, to: str | None = None
    ) -> Callable[[Callable[[Event], Any]], Callable[[Event], Any]]:
        """Decorator: ``fn(event)`` returns the data of an event stored as ``type`` in the shape
        of ``to`` (default: the next version, ``"OrderPlaced"`` -> ``"OrderPlaced.v2"``,
        ``"OrderPlaced.v2"`` -> ``"OrderPlaced.v3"``), applied by every executor before any
        handler sees the event; stored events are not rewritten (see
        :mod:`eventlanes.upcasting`). Refused where written: a wrong signature, a second one for
        ``type``, a gap or cycle in a chain, a processor handling ``type``."""

        def register(fn: Callable[[Event], Any]) -> Callable[[Event], Any]:
            if self.running:
                raise InvalidInputError("register upcasters before the app starts")
            handled = [(f"{p._kind} {p.name!r}", p.handled_types())
                       for p in self.processors.values()]  # fmt: skip
            self.runtime.upcasters.add(type, fn, to, handled)
            return fn

        return register

    @property
    def upcasters(self) -> Upcasters:
        """The registered upcasters (``app.upcasters.current("OrderPlaced")``: the type such
        events are read as)."""
        return self.runtime.upcasters

    def upcast(self, events: Iterable[Event]) -> list[Event]:
        """``events`` read from the store (``app.store.read...``: as stored) in their current
        shapes, as handlers see them."""
        return self.runtime.upcasters.events(list(events))

    def _add(self, proc: Any) -> Any:
        if proc.name in self.processors or proc.name in self.ingestors:
            raise InvalidInputError(f"processor {proc.name!r} is already defined in this app")
        for other in self._versions_of(proc.base):
            _check_versions(other, proc)
        self.processors[proc.name] = proc
        return proc

    def _versions_of(self, base: str) -> list[Processor]:
        """The versions of processor ``base`` this app defines, lowest first."""
        found = [p for p in self.processors.values() if p.base == base]
        return sorted(found, key=lambda p: p.version)

    def get(self, name: str) -> Processor:
        """The processor defined with this name (``orders@v2`` for a version); InvalidInputError
        naming the defined ones otherwise."""
        try:
            return self.processors[name]
        except KeyError:
            known = ", ".join(self.processors) or "none"
            raise InvalidInputError(f"unknown processor {name!r} (defined: {known})") from None

    def _selected(self, names: list[str] | None) -> list[Processor]:
        if not names:
            return list(self.processors.values())
        return [self.get(n) for n in names]

    # -- running -------------------------------------------------------------------------------
    def start(
        self,
        processors: list[str] | None = None,
        *,
        node_index: int | None = None,
        nodes: int | None = None,
        balance: bool = False,
        observer: Observer | None = None,
        metrics_port: int | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Start the processors in background threads of this process; ``balance``: this node
        also splits and merges segments when it is the balancing node (see ``balance``);
        ``metrics_port``: serve Prometheus metrics there (``observer``: your own
        :class:`Observer` instead, or a ``PrometheusObserver`` to serve). ``on_ready()`` is
        called once every processor runs, unless one has crashed by then (never after a
        crash was logged)."""
        if self._runners or self._ingest_runners:
            raise RuntimeError("this app is already running")
        ingest = [n for n in (processors or self.ingestors) if n in self.ingestors]
        named = None if not processors else [n for n in processors if n not in self.ingestors]
        selected = [] if named == [] else self._selected(named)  # []: only ingestors named
        if not selected and not ingest:
            raise InvalidInputError("this app defines no processor to run")
        static = None
        if node_index is not None or nodes is not None:
            if node_index is None or nodes is None:
                raise InvalidInputError("static mode needs both node_index and nodes")
            static = (node_index, nodes)
        chosen = self._observe(observer, metrics_port, [*(p.name for p in selected), *ingest])
        if chosen is not None:
            self.runtime.observer = chosen
        self._wakeup = wakeup_for(self.store, self.poll_interval)
        owner = node_name()
        self._start_ingest(ingest, owner)
        for proc in selected:
            runner = ProcessorRunner(self.runtime, proc, owner, static, self._wakeup)
            runner.start()
            self._runners.append(runner)
            if balance and static is None:
                balancer = Balancer(self.runtime, proc, owner)
                balancer.start()
                self._balancers.append(balancer)
        if on_ready is not None:
            unless_crashed([*self._runners, *self._ingest_runners], on_ready)

    def _start_ingest(self, names: list[str], owner: str) -> None:
        from .kafka.ingest import IngestRunner

        runners = [IngestRunner(self.runtime, self.ingestors[n], owner) for n in names]
        for runner in runners:
            runner.check()  # the broker answers, within its timeout: before anything starts
        for runner in runners:
            runner.start()
            self._ingest_runners.append(runner)

    def check_ingestors(self, names: list[str] | None = None) -> None:
        """Raise (one clear error) unless every ingestor's broker answers with its topic."""
        from .kafka.ingest import IngestRunner

        for name in names or list(self.ingestors):
            if name in self.ingestors:
                IngestRunner(self.runtime, self.ingestors[name], node_name()).check()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batches in hand, store tokens, release claims; within ``timeout`` seconds
        in all, else raise :class:`StopTimeoutError` (the claims of what still runs expire)."""
        self._stop.set()
        ingest, self._ingest_runners = self._ingest_runners, []
        for ing in ingest:
            ing.stopping.set()
        for balancer in self._balancers:
            balancer.stop()
        self._balancers = []
        runners, self._runners = self._runners, []
        for runner in runners:
            runner.stopping.set()
        deadline = time.monotonic() + timeout
        stuck = [r.name for r in runners if not r.stop(max(0.0, deadline - time.monotonic()))]
        stuck += [r.name for r in ingest if not r.stop(max(0.0, deadline - time.monotonic()))]
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        if self._metrics is not None:
            self._metrics, server = None, self._metrics
            server.close()
        crashed = [r for r in [*runners, *ingest] if r.error is not None]
        if crashed:
            error = crashed[0].error
            assert error is not None
            raise ProcessorCrashedError(crashed[0].name, describe_crash(error)) from error
        if stuck:
            raise StopTimeoutError(
                f"processor(s) {', '.join(stuck)} did not stop within {timeout:g} s (a handler "
                "still runs); their claims expire and another node continues"
            )

    def _observe(
        self, observer: Observer | None, port: int | None, names: list[str]
    ) -> Observer | None:
        """The observer for this start (None: keep the app's), serving metrics on ``port``."""
        if port is None:
            return observer
        try:
            from prometheus_client import CollectorRegistry

            from .admin.metrics import MetricsServer, PrometheusObserver, registry_for
        except ImportError as exc:
            raise InvalidInputError(
                f"metrics need prometheus-client ({exc}): pip install 'eventlanes[ops]'"
            ) from None
        if observer is None:
            observer = PrometheusObserver(CollectorRegistry())
        if not isinstance(observer, PrometheusObserver):
            raise InvalidInputError("metrics_port needs no observer or a PrometheusObserver")
        self._metrics = MetricsServer(registry_for(self, observer, names), port)
        return observer

    @property
    def observer(self) -> Observer:
        """The observer the runners report batches to (metrics implement it)."""
        return self.runtime.observer

    @property
    def metrics_port(self) -> int | None:
        """The port metrics are served on (useful with ``metrics_port=0``)."""
        return None if self._metrics is None else self._metrics.port

    @property
    def running(self) -> bool:
        """Whether processors or ingestors of this app run in this process."""
        return bool(self._runners or self._ingest_runners)

    def run(
        self,
        processors: list[str] | None = None,
        *,
        grace: float = 30.0,
        node_index: int | None = None,
        nodes: int | None = None,
        balance: bool = False,
        observer: Observer | None = None,
        metrics_port: int | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Run until SIGINT/SIGTERM (or ``stop()`` from another thread), then shut down cleanly
        within ``grace`` seconds; a runner that crashed stops the rest and
        :class:`ProcessorCrashedError` is raised (the crash chained as its cause). The other
        options are :meth:`start`'s."""
        if self._runners or self._ingest_runners:
            raise RuntimeError("this app is already running")
        self._stop.clear()
        try:
            run_until_signal(
                self._stop,
                lambda: any(r.stopping.is_set() for r in [*self._runners, *self._ingest_runners]),
                start=lambda: self.start(
                    processors,
                    node_index=node_index,
                    nodes=nodes,
                    balance=balance,
                    observer=observer,
                    metrics_port=metrics_port,
                    on_ready=on_ready,
                ),
            )
        finally:
            self.stop(grace)  # also what a start that failed half-way had started

    def wait_for(self, name: str, positions: int | Iterable[int], timeout: float = 30.0) -> None:
        """Read-your-writes: block until processor ``name`` has handled the events at
        ``positions`` (e.g. what ``append`` returned); raises TimeoutError after ``timeout``."""
        status.wait_for(self.runtime, self.get(name), positions, timeout)

    def wait_until_caught_up(
        self, timeout: float = 60.0, processors: list[str] | None = None
    ) -> None:
        """Block until every segment of the processors has reached the store's head; first,
        until each Kafka ingestor (all of them, or those named) has appended every record
        its topic held when the call began (the high watermarks read then)."""
        deadline = time.monotonic() + timeout
        ingest = [n for n in (processors or self.ingestors) if n in self.ingestors]
        named = None if not processors else [n for n in processors if n not in self.ingestors]
        if ingest:
            from .kafka.status import wait_caught_up

            found = [self.ingestors[n] for n in ingest]
            wait_caught_up(self.db, found, self._ingest_runners, self.claim_timeout, deadline)
        head = 0  # the last head read: it only grows
        while True:
            crashed = [r.error for r in self._runners if r.error is not None]
            if crashed:
                raise RuntimeError(f"a processor crashed: {crashed[0]!r}") from crashed[0]
            selected = [] if named == [] else self._selected(named)
            names = {p.name for p in selected}
            # A segment held here still short of a head already read is not caught up: no
            # need to ask the database (its stored token is at most the one in memory).
            behind = any(
                st.token.position < head and not st.lost
                for r in self._runners
                if r.name in names
                for st in list(r.claimed.values())
            )
            if not behind:
                head = self.runtime.store.head()
                if all(status.caught_up(self.runtime, p, head) for p in selected):
                    return
            if time.monotonic() > deadline:
                views = [self.status(p.name) for p in selected]
                lagging = {v.name: v.lag for v in views if not v.caught_up}
                raise TimeoutError(f"processors not caught up after {timeout} s: {lagging}")
            time.sleep(0.05)

    # -- inspecting and steering ---------------------------------------------------------------
    def status(self, name: str) -> ProcessorView:
        """Where the processor is, per segment, and for a processor with versions which one
        serves and how far behind it this one is (reads only: nothing is created)."""
        proc = self.get(name)
        view = status.status(self.runtime, proc)
        defined = [p.version for p in self._versions_of(proc.base)]
        return replace(view, version=lifecycle.view(self.runtime, proc, view, defined))

    def ingest_status(self, name: str) -> Any:
        """Where the ingestor is, per partition (:class:`eventlanes.kafka.status.IngestorView`;
        reads only)."""
        from .kafka import status

        self._ingestor(name)
        return status.view(self.db, name, self.claim_timeout)

    def _ingestor(self, name: str) -> Ingestor:
        try:
            return self.ingestors[name]
        except KeyError:
            known = ", ".join(self.ingestors) or "none"
            raise InvalidInputError(f"unknown ingestor {name!r} (defined: {known})") from None

    def initialize(self, name: str) -> None:
        """Create the processor's token rows if they do not exist yet (the runners and the
        commands that change tokens do it themselves)."""
        self.runtime.initialize(*self.get(name).token_spec())

    def reset(
        self,
        name: str,
        to: str | int | datetime = "tail",
        *,
        wait: bool = False,
        timeout: float | None = None,
        context: Any = None,
    ) -> int:
        """Reset a stopped processor and replay from ``to`` ("tail", "head", a position or a
        time); refuses while a live node holds a segment unless ``wait``."""
        return reset.reset(self.runtime, self.get(name), to, wait, timeout, context)

    def reset_plan(
        self, name: str, to: str | int | datetime = "tail", *, context: Any = None
    ) -> ResetPlan:
        """What ``reset(name, to)`` would do, read without writing: how many events it replays
        (handled before) and handles for the first time, which segments a live node holds, and
        warnings (e.g. rows its handlers would write twice without an ``on_reset`` handler)."""
        return reset.reset_plan(self.runtime, self.get(name), to, context)

    def balance(self, name: str, timeout: float = 15.0) -> list[str]:
        """Split or merge the processor's segments, one operation at a time, until the live
        nodes can share them evenly (see ``eventlanes.processing.running.balance``)."""
        return balance(self.runtime, self.get(name), timeout)

    def pause(self, name: str) -> bool:
        """Pause the processor on every node (segments released, not claimed until resumed);
        True if this call paused it. An ingestor releases its partitions the same way."""
        if name in self.ingestors:
            return self.tokens.pause(name)
        return control.pause(self.runtime, self.get(name))

    def resume(self, name: str) -> bool:
        """Resume a paused processor (or ingestor) on every node; True if this call resumed it."""
        if name in self.ingestors:
            return self.tokens.resume(name)
        return control.resume(self.runtime, self.get(name))

    def split(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owner of segment ``segment_id`` to split it (done here when nobody holds it);
        returns what was done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "split", timeout)

    def merge(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owners of segment ``segment_id`` and its sibling to merge them; returns what was
        done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "merge", timeout)

    def release(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owner of segment ``segment_id`` to store its token and let it go; returns what
        was done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "release", timeout)

    def dead_letter_list(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> list[DeadLetter]:
        """A processor's parked events, or an ingestor's parked records (``position`` packs
        partition and offset, ``version`` is the offset, the key is the stream)."""
        if name in self.ingestors:
            return self.dead_letters.list(name, key, position)
        return dead_letters.list_dead_letters(self.runtime, self.get(name), key, position)

    def retry_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> tuple[int, int]:
        """Re-run parked events (all, one key's, or one position's); (handled, still parked).
        For an ingestor: fetch its parked records again and append them."""
        if name in self.ingestors:
            from .kafka import parking

            return parking.retry(self.runtime, self.ingestors[name], key, position)
        return dead_letters.retry_dead_letters(self.runtime, self.get(name), key, position)

    def discard_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> int:
        """Drop parked events (all, one key's, or one position's) for good; returns how many."""
        if name in self.ingestors:
            from .kafka import parking

            return parking.discard(self.runtime, self.ingestors[name], key, position)
        return dead_letters.discard_dead_letters(self.runtime, self.get(name), key, position)

    # -- versions (blue/green: eventlanes.admin.versions) ----------------------------------
    def promote(self, name: str) -> str:
        """Switch readers of a processor to its version ``name`` (``"orders@v2"``, or the
        plain name for version 1): ``app.table(...)`` and ``app.serving(...)`` resolve to it
        from then on, in every process. Refused with :class:`VersionError`, giving every
        reason, unless it has caught up: each segment at the head of every store it reads
        (read now), no failing segment, no parked dead letter, not paused. Writes one row
        (no DDL: a role with DML only may promote)."""
        proc = self.get(name)
        defined = [p.version for p in self._versions_of(proc.base)]
        return lifecycle.promote(self.runtime, proc, defined)

    def retire_plan(self, name: str, *, keep_tables: bool = False) -> lifecycle.RetirePlan:
        """What ``retire(name)`` would drop, read without writing; raises
        :class:`VersionError` when it would be refused."""
        return lifecycle.retire_plan(self.runtime, name, self._retirable(name), keep_tables)

    def retire(self, name: str, *, keep_tables: bool = False) -> lifecycle.RetirePlan:
        """Drop an old version (``"orders"``: version 1; ``"orders@v2"``) for good: its
        tokens, aggregation states, dead letters and Spark batches, and the tables its
        processor's versions declare (``tables=``; ``keep_tables``: leave them, e.g. for a
        role that may not drop them). Never done by itself; refused while the version serves
        readers or runs anywhere. Returns what was dropped. Its definition may already be
        gone from the app; another version of the processor must be defined."""
        return lifecycle.retire(self.runtime, name, self._retirable(name), keep_tables)

    def _retirable(self, name: str) -> list[Processor]:
        base, _ = split_version(validate_processor_name(name))
        procs = self._versions_of(base)
        if not procs:
            raise InvalidInputError(
                f"unknown processor {name!r}: no version of {base!r} is defined in this app"
            )
        return procs

    def serving(self, name: str) -> Processor:
        """The definition of the version of processor ``name`` that readers see (the last
        one promoted; before any promotion the lowest that has run), e.g. to read an
        aggregation: ``app.serving("totals").get(key)``."""
        base = validate_base_name(name)
        defined = {p.version: p for p in self._versions_of(base)}
        version = lifecycle.serving(self.runtime, base, defined)
        if version is None or version not in defined:
            raise InvalidInputError(
                f"readers of {base!r} see version {version}, which this app does not define"
                if version is not None
                else f"unknown processor {name!r}"
            )
        return defined[version]

    def table(self, name: str, processor: str | None = None) -> str:
        """The full name of table ``name`` of the version of ``processor`` that serves
        readers: ``{prefix}name`` for version 1, ``{prefix}name__vN`` once version N is
        promoted. Without ``processor``: the one processor of the app that declares the table
        (``tables=[...]``). Read on every call, so a promotion in another process counts at
        once."""
        try:
            check_table_name(name)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        if processor is None:
            bases = sorted({p.base for p in self.processors.values() if name in p.tables})
            if len(bases) != 1:
                raise InvalidInputError(
                    f"no processor of this app declares table {name!r} (tables=[...])"
                    if not bases
                    else f"table {name!r} is declared by {', '.join(bases)}: name the processor"
                )
            processor = bases[0]
        base = validate_base_name(processor)
        defined = [p.version for p in self._versions_of(base)]
        return lifecycle.table_name(self.runtime, name, base, defined)

    def close(self) -> None:
        """Stop what still runs and close the app's stores and connections."""
        if self._runners or self._ingest_runners:
            self.stop()
        self.runtime.close()


def _check_versions(old: Processor, new: Processor) -> None:
    """Two versions of one processor must be the same kind and, where replays are told per
    part, route events alike: a new version's replays are the events the old one had handled,
    known per segment of the old one's routing."""
    low, high = sorted((old, new), key=lambda p: p.version)
    if type(low) is not type(high):
        raise InvalidInputError(
            f"{high._kind} {high.name!r} is version {high.version} of {low._kind} {low.name!r}: "
            "versions of a processor must be of the same kind"
        )
    if high._routes_as_versions and low.policy.routing != high.policy.routing:
        raise InvalidInputError(
            f"processor {high.name!r} routes events by {high.policy.name}, its version "
            f"{low.version} by {low.policy.name}: a new version must route as the old one "
            "does (the events the old one had handled are known per segment of its routing); "
            "pass the same policy to both (one function object for a custom one)"
        )
