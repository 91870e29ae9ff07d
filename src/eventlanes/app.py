"""The App: an event store, its token store, and the processors that consume it.

Nothing connects when an App is defined (modules that define one are imported by the CLI and by
worker processes); the store is opened on first use. The App is the façade: it keeps the
registry of processors, ingestors and upcasters (their options: ``processing/options.py``),
builds the :class:`~eventlanes.processing.runtime.Runtime` that the runners, admin commands and
the Spark pipeline work with, and starts and stops what runs in this process (``node.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal, Unpack

from .admin.operations import Operations
from .db import Database
from .errors import InvalidInputError
from .events import Event
from .kafka.ingest import IngestRunner
from .kafka.ingestor import Ingestor, OnBad
from .kafka.publisher import define_publisher
from .kafka.records import DEFAULT_MAX_BYTES, Record
from .kafka.settings import Kafka
from .node import DEFAULT_METRICS_HOST, Node, serve_metrics, static_mode
from .observe import Observer
from .processing.aggregating.aggregation import Aggregation
from .processing.aggregating.declarative import Op
from .processing.options import (
    AggregationOptions,
    Guarantee,
    ProcessorOptions,
    RepublisherOptions,
    refuse_unknown,
)
from .processing.processor import Processor
from .processing.republisher import Republisher
from .processing.running.runner import ProcessorRunner
from .processing.runtime import Runtime
from .processing.tables.dead_letters import DeadLetterStore
from .processing.tables.states import StateTable
from .registry import Registry
from .schema import Migrated
from .signals import Stopping, run_until_signal
from .store import EventStore
from .tokens import DEFAULT_CLAIM_TIMEOUT, SQLTokenStore, TokenStore
from .upcasting import Upcasters
from .windows.spec import DEFAULT_RETAIN

log = logging.getLogger("eventlanes.app")


class App(Operations):
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
        self.registry = Registry()
        #: the definitions by name (the registry's own tables)
        self.processors: dict[str, Processor] = self.registry.processors
        self.ingestors: dict[str, Ingestor] = self.registry.ingestors
        super().__init__(self.runtime, self.registry, Node(self.runtime))
        self._metrics: Any = None  # the metrics HTTP server while running
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
    def processor(self, name: str, **options: Unpack[ProcessorOptions]) -> Processor:
        """Define a processor (see :class:`~eventlanes.processing.processor.Processor`) with
        the options of :class:`~eventlanes.processing.options.ProcessorOptions`."""
        refuse_unknown("App.processor()", options, ProcessorOptions)
        rt = self.runtime
        return self.registry.add(
            Processor(name, prefix=rt.prefix, upcasters=rt.upcasters, **options)
        )

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
        window: Any = None,
        time: Any = None,
        lateness: Any = "0s",
        max_future: Any = None,
        clock: str = "store",
        late: str = "park",
        retain: Any = DEFAULT_RETAIN,
        idle_close: Any = None,
        tick_lag: Any = "0s",
        **options: Unpack[AggregationOptions],
    ) -> Aggregation:
        """An exactly-once aggregation (see ``eventlanes.processing.aggregating``): states by
        ``key`` (``event -> key``, or the name of a data property), each made by ``initial()``
        and updated by the folds of ``@agg.on(type)``, written every ``persist_every``
        seconds; or declared: ``fields={"n": el.count(), ...}`` over the events of types
        ``on``, folded inside SQLite where exact unless ``pushdown=False``; ``publish``: an
        :class:`eventlanes.kafka.KafkaSink` each written state (a windowed one: each closed
        window) is published to first. The other options are
        :class:`~eventlanes.processing.options.AggregationOptions`: it routes by its key (no
        ``policy``) and its guarantee is ``"aggregation"``.

        ``window=el.tumbling("1m")`` (or ``el.hopping(size, every=)``, ``el.session(gap=)``:
        a Python fold then says how two sessions merge with ``@agg.on_merge``) folds each key's
        inputs per time window: ``time`` (``el.event_time(prop)``; ``recorded_at`` by
        default), ``lateness`` (how far behind the clock an input may still be folded),
        ``max_future`` (times past ``recorded_at`` by more are clamped; default the
        lateness), ``clock`` (``"store"``: the log's, the same for any segment count;
        ``"key"``: each key's), ``late`` (``"park"``: kept and listed; ``"amend"``: folded
        into the closed window as a new revision; ``"count"``), ``retain`` (how long closed
        windows are kept), ``idle_close`` (append a tick once no input came for that long, so
        windows close when data stops; a tick's time is its ``recorded_at`` less
        ``tick_lag``). See the windows how-to."""
        refuse_unknown("App.aggregation()", options, AggregationOptions)
        rt = self.runtime
        return self.registry.add(
            Aggregation(
                name, key=key, initial=initial, persist_every=persist_every, fields=fields,
                on=on, pushdown=pushdown, publish=publish, states=lambda: rt.states,
                prefix=rt.prefix, upcasters=rt.upcasters, window=window, time=time,
                lateness=lateness, max_future=max_future, clock=clock, late=late,
                retain=retain, idle_close=idle_close, tick_lag=tick_lag,
                windows=lambda: rt.windows, **options,
            )
        )  # fmt: skip

    def republisher(
        self,
        name: str,
        *,
        to_stream: str | Callable[[Event], str],
        to_store: str | EventStore | None = None,
        **options: Unpack[RepublisherOptions],
    ) -> Republisher:
        """A processor appending derived events with their source chain; see
        :class:`eventlanes.processing.republisher.Republisher`. ``to_stream``: the stream
        they are appended to, a name or ``event -> name``; ``to_store``: another store (URL or
        store) to append to (default: the app's). The other options are
        :class:`~eventlanes.processing.options.RepublisherOptions` (its guarantee is
        ``"at-least-once"``)."""
        refuse_unknown("App.republisher()", options, RepublisherOptions)
        rt = self.runtime
        return self.registry.add(
            Republisher(
                name, to_stream=to_stream, to_store=to_store, stores=rt.store_at,
                prefix=rt.prefix, upcasters=rt.upcasters, **options,
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
        order: Literal["arrival", "time"] = "arrival",
        max_record_bytes: int = DEFAULT_MAX_BYTES,
        max_partitions: int | None = None,
        trust_chains: Any = None,
        check_roots: bool = True,
    ) -> Ingestor:
        """An ingestor appending the records of a Kafka ``topic`` to the store, exactly once
        (see :class:`eventlanes.kafka.Ingestor`, which describes its options: ``stream``,
        ``type`` and ``decode`` make a record an event, ``on_bad`` says what a bad record
        does, ``initial`` where a new partition starts, ``batch_size`` the records per
        transaction, ``order`` whether partitions are interleaved by time,
        ``max_record_bytes`` the largest record, ``max_partitions`` the partitions per
        process, ``trust_chains`` whose ``el-source-chain`` headers are carried on,
        ``check_roots`` whether their roots on this cluster are checked); ``run`` starts it
        like a processor. Its name shares the token table with the processors' names."""
        ingestor = Ingestor(
            self.runtime, name, kafka, topic=topic, stream=stream, type=type, decode=decode,
            on_bad=on_bad, initial=initial, batch_size=batch_size, order=order,
            max_record_bytes=max_record_bytes, max_partitions=max_partitions,
            trust_chains=trust_chains, check_roots=check_roots,
        )  # fmt: skip
        return self.registry.add_ingestor(ingestor)

    def publisher(
        self,
        name: str,
        sink: Any,
        *,
        on: str | list[str] | None = None,
        key: Any = None,
        value: Any = None,
        **options: Unpack[ProcessorOptions],
    ) -> Processor:
        """A processor publishing events (of types ``on``; all by default) to a Kafka topic
        (see ``eventlanes.kafka.publisher``): ``sink`` is an
        :class:`eventlanes.kafka.KafkaSink`; record key ``key(event)`` (default: the stream
        id), value ``value(event)`` (default: the event's data). Each segment batch is
        published and acknowledged before its token commits (at least once). The other
        options are :class:`~eventlanes.processing.options.ProcessorOptions`."""
        refuse_unknown("App.publisher()", options, ProcessorOptions)
        return define_publisher(
            self.processor, self.runtime, name, sink, on=on, key=key, value=value, **options
        )

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
            handled = [(f"{p.kind} {p.name!r}", p.handled_types())
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
        metrics_host: str = DEFAULT_METRICS_HOST,
    ) -> None:
        """Start the processors in background threads of this process; ``balance``: this node
        also splits and merges segments when it is the balancing node (see ``balance``);
        ``metrics_port``: serve Prometheus metrics there, on the address ``metrics_host``
        (all interfaces by default, so a pod is scraped; ``"127.0.0.1"``: this host only;
        ``observer``: your own
        :class:`Observer` instead, or a ``PrometheusObserver`` to serve). ``on_ready()`` is
        called once every processor runs, unless one has crashed by then (never after a
        crash was logged)."""
        if self.running:
            raise RuntimeError("this app is already running")
        selected, found = self.registry.split(processors)
        ingest = [i.name for i in found]
        if not selected and not ingest:
            raise InvalidInputError("this app defines no processor to run")
        self._refuse_tokens_elsewhere(selected)
        for proc in selected:
            if isinstance(proc, Republisher):
                proc.check_target(self.runtime.store)
        static = static_mode(node_index, nodes)
        chosen = self._observe(
            observer, metrics_port, [*(p.name for p in selected), *ingest], metrics_host
        )
        if chosen is not None:
            self.runtime.observer = chosen
        self.node.start(selected, found, static, balance, on_ready)

    def _refuse_tokens_elsewhere(self, selected: list[Processor]) -> None:
        """What commits its writes with its token, refused a token store in another database
        (its batches would roll back as lost claims and run again, for ever)."""
        rt = self.runtime
        tokens = rt.tokens
        if not isinstance(tokens, SQLTokenStore) or tokens.db.url.target == rt.db.url.target:
            return  # another store's tokens in the same database commit there too
        for proc in selected:
            if proc.guarantee is not Guarantee.AT_LEAST_ONCE:
                kind = "aggregation" if isinstance(proc, Aggregation) else "processor"
                raise InvalidInputError(
                    f"{kind} {proc.name!r} is exactly-once: what it writes commits with its "
                    "token in the event store's database, and this app's token_store= is "
                    "another (leave token_store= unset)"
                )

    def check_ingestors(self, names: list[str] | None = None) -> None:
        """Raise (one clear error) unless every ingestor's broker answers with its topic."""
        self.node.check([self.ingestors[n] for n in names or self.ingestors if n in self.ingestors])

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batches in hand, store tokens, release claims; within ``timeout`` seconds
        in all, else raise :class:`StopTimeoutError` (the claims of what still runs expire)."""
        self._stop.set()
        self.node.stop(timeout, before_raising=self._close_metrics)

    def _close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics, server = None, self._metrics
            server.close()

    @property
    def _runners(self) -> list[ProcessorRunner]:
        return self.node.runners

    @property
    def _ingest_runners(self) -> list[IngestRunner]:
        return self.node.ingest_runners

    def _observe(
        self, observer: Observer | None, port: int | None, names: list[str], host: str
    ) -> Observer | None:
        """The observer for this start (None: keep the app's), serving metrics on ``port``
        of ``host``."""
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
        registry = registry_for(self, observer, names)
        self._metrics = serve_metrics(lambda p, h: MetricsServer(registry, p, h), port, host)
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
        return self.node.running

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
        metrics_host: str = DEFAULT_METRICS_HOST,
    ) -> None:
        """Run until SIGINT/SIGTERM (or ``stop()`` from another thread), then shut down cleanly
        within ``grace`` seconds; a runner that crashed stops the rest and
        :class:`ProcessorCrashedError` is raised (the crash chained as its cause). The other
        options are :meth:`start`'s."""
        if self.running:
            raise RuntimeError("this app is already running")
        self._stop.clear()

        def shut_down(stopping: Stopping) -> None:
            # also what a start that failed half-way had started; a second signal meanwhile
            # exits at once (signals.exit_at_once)
            if stopping.signal is not None and stopping.second_exits:
                log.info("stopping: finishing the batches in hand (up to %g s; %s again exits "
                         "at once)", grace, stopping.signal)  # fmt: skip
            self.stop(grace)
            if stopping.signal is not None:
                log.info("stopped cleanly: batches finished, tokens stored, claims released")

        run_until_signal(
            self._stop,
            self.node.stopping,
            start=lambda: self.start(
                processors,
                node_index=node_index,
                nodes=nodes,
                balance=balance,
                observer=observer,
                metrics_host=metrics_host,
                metrics_port=metrics_port,
                on_ready=on_ready,
            ),
            then=shut_down,
        )

    def close(self) -> None:
        """Stop what still runs and close the app's stores and connections."""
        if self.running:
            self.stop()
        self.runtime.close()
