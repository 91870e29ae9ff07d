"""Continuous aggregations on Spark: ``eventlanes run --engine spark``.

A loop on the driver runs micro-batches: it reads the events after the stored token (at most
``max_rows``) with the same range reader as a bulk replay (no registered data source, nothing
planned in a Python process on the driver), folds them with the user's code on Arrow batches
onto the states stored so far, checks that Spark read every event of the range, then writes,
in one transaction fenced by the claims: the new states, every segment's token (so
``eventlanes status`` shows progress) and a row in ``{prefix}spark_batches``. The token store
is the checkpoint: a runner killed at any point resumes from the last committed batch, exactly.
With a Delta table to keep current (``delta=``, written by a replay first), each batch's
changed states are merged into it before that commit
(:meth:`eventlanes.lakehouse.delta.DeltaStates.merge`).

Why not Structured Streaming over a Python ``DataSourceStreamReader`` (what this module used
first): Spark runs that source's offset planning in a Python process on the driver, started
with the executors' interpreter (``PYSPARK_PYTHON``). On a cluster that interpreter is the
nodes' (``python3``, ``./environment/bin/python`` from ``--archives``), which the driver does
not have: the query failed at start. The stateless fold is the one used: on the same backlog
it ran about 2x as fast as Spark's own stateful operator (``transformWithStateInPandas`` with
RocksDB state; ``benchmarks/bench_spark_state.py``), and needs neither a state store nor
protobuf.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..db import open_database
from ..db.weather import Backoff, is_transient
from ..errors import EventlanesError, InvalidInputError, SparkJobError
from ..lakehouse import DeltaStates
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.publish import publish_stored
from ..processing.tables.states import Entry, StateTable
from ..processing.windowing.ticker import Ticker
from ..schema import require
from ..signals import run_until_signal
from ..tokens import Token
from ..tokens.claims import Heartbeat, claim_all, node_name, release_all
from ..tracing import spans
from .bulk_replay import (
    collect_states,
    fold_aggregation,
    fold_stages,
    functions_of,
    save_states,
)
from .fold import spec_of
from .input import check_read, refuse_sources, upcasters_of
from .session import get_session, master_of, partitions_of
from .ship import executor_url, first_line, preflight
from .source import read_events
from .window_batches import fold_window_batch
from .windows import refuse_windowed_delta, refuse_windows

log = logging.getLogger("eventlanes.spark")


@dataclass
class StoredStates:
    """Loads the stored states of a micro-batch's keys, in the executor (picklable)."""

    url: str
    name: str

    def __call__(self, keys: list[str]) -> dict[str, Entry]:
        db = open_database(self.url, create=False)  # reads only: never creates anything
        try:
            table = StateTable(db)
            with db.connection() as conn:
                return table.load(conn, self.name, keys)
        finally:
            db.close()


class ContinuousAggregation:
    """One aggregation kept up to date on Spark: ``start()``, ``stop()``; ``error`` is set if
    a micro-batch failed (the loop then stops; nothing of that batch was written). A windowed
    one's micro-batches: :mod:`.window_batches`."""

    def __init__(
        self,
        app: Any,
        name: str,
        spark: Any = None,
        trigger_seconds: float = 1.0,
        max_rows: int | None = None,
        partitions: int | None = None,
        wait: bool = True,
        delta: str | None = None,
        delta_options: Mapping[str, str] | None = None,
    ) -> None:
        agg = app.get(name)
        if not isinstance(agg, Aggregation):
            raise InvalidInputError(f"{name!r} is not an aggregation: --engine spark runs those")
        refuse_windows(agg)
        refuse_sources(agg)
        if delta:
            refuse_windowed_delta(agg)
        #: the Delta table kept current (written by a replay first), or None
        self.delta = DeltaStates(delta, agg.name, agg.declaration, delta_options) if delta else None
        self.app, self.agg = app, agg
        self.spark = spark or get_session()
        self.url = executor_url(app.url, master_of(self.spark))
        self.n = partitions_of(self.spark, partitions)
        self.trigger_seconds = trigger_seconds
        self.max_rows = max_rows
        self.wait = wait
        self.owner = f"spark:{node_name()}"
        app.aggregate_states  # noqa: B018 - checks the states table: executors only read it
        self.batches = app.db.table("spark_batches")
        require(app.db, "spark_batches")  # the table: eventlanes.schema.v1_initial
        self.error: BaseException | None = None
        spec = agg.windowing
        #: with ``idle_close``: appends a tick when no batch has run for that long and
        #: windows are open (as a local worker's)
        self.ticker = None
        if spec is not None and spec.idle_close is not None:
            self.ticker = Ticker(app.store, spec.idle_close, agg.name)
        self.records: list = []
        self._beat: Heartbeat | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        app, agg = self.app, self.agg
        preflight(self.spark, functions_of(agg), self.url, head=app.store.head())
        # The local engine must not run this aggregation at the same time: hold every claim.
        app.initialize(agg.name)
        self.records = claim_all(app.tokens, agg.name, self.owner, self.wait, None)
        self._beat = Heartbeat(app.tokens, agg.name, self.owner, announce=False).start()
        if self.delta is not None:  # a table that cannot follow the store: said at once
            try:
                tokens = {s.segment.id: s.token.position for s in app.tokens.status(agg.name)}
                self.delta.follows(tokens, app.store.head())
            except BaseException:
                self.stop()
                raise
        loop = threading.Thread(target=self._loop, daemon=True)
        self._threads = [loop]
        loop.start()

    def _loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                busy = self.run_batch()
                backoff.reset()
            except BaseException as exc:  # noqa: BLE001 - reported through ``error``
                if isinstance(exc, Exception) and is_transient(exc):
                    delay = backoff.next()  # the database is away: the batch is tried again
                    log.warning("%s: database unavailable (%s); retrying in %.0f s",
                                self.agg.name, exc, delay)  # fmt: skip
                    self._stop.wait(delay)
                    continue
                self.error = exc
                return
            if self.ticker is not None:
                self._tick(busy)
            if not busy:
                self._stop.wait(self.trigger_seconds)

    def _tick(self, busy: bool) -> None:
        """A batch ran: the quiet starts again; none, with windows open: perhaps a tick."""
        assert self.ticker is not None
        if busy:
            self.ticker.heard()
        elif self.app.runtime.windows.has_open(self.agg.name):
            self.ticker.check()

    def run_batch(self) -> bool:
        """Fold the events after the stored token (at most ``max_rows``) onto the stored
        states; write states and tokens in one transaction. False: nothing new. With tracing
        on, a micro-batch that folds events is one span (``process NAME``, engine spark)."""
        app, agg = self.app, self.agg
        current = {s.segment.id: s.token for s in app.tokens.status(agg.name)}
        after = min(t.position for t in current.values())
        head = app.store.head()
        if head <= after:
            return False
        tracer = spans.tracer()
        if tracer is None:
            return self._fold(current, after, head, None)
        base = spans.base_attributes(agg.name, None, agg.guarantee.value,
                                     getattr(agg, "version", None))  # fmt: skip
        with spans.batch(tracer, "process", base, count=0, extra={spans.ENGINE: "spark"}) as span:
            return self._fold(current, after, head, span)

    def _fold(self, current: dict[int, Token], after: int, head: int, span: Any) -> bool:
        app, agg = self.app, self.agg
        end = min(head, after + self.max_rows) if self.max_rows else head
        expected = app.store.count(until=end) - app.store.count(until=after)
        if span is not None:
            span.set_attributes({spans.MESSAGE_COUNT: expected, spans.POSITION: after + 1,
                                 spans.POSITION_LAST: end, spans.TOKEN: end})  # fmt: skip
        if agg.windowing is not None:
            fold_window_batch(self, current, end)
            return True
        df, read = read_events(self.spark, self.url, after, end, self.n, None, upcasters_of(agg))
        spec = spec_of(agg, app.store.events_table)
        folded = fold_aggregation(spec, df, self.n, StoredStates(self.url, agg.name))
        if spec.stages:
            folded = folded.cache()
        try:
            states = collect_states(folded)
            check_read(agg.name, f"micro-batch ({after:,}, {end:,}] read", read.total(), expected)
            url = self.url
            for plan in fold_stages(spec, folded, self.n, lambda s: StoredStates(url, s)):
                for name, entries in collect_states(plan).items():
                    states.setdefault(name, {}).update(entries)
        finally:
            if spec.stages:
                folded.unpersist()
        publishers: list[Any] = [agg, *agg.stages]
        for published in publishers:  # downstream first: the store's commit after
            if published.publish is not None:
                encoded = states.get(published.name, {})
                rows = [(key, value, offsets) for key, (value, offsets, *_) in
                        sorted(encoded.items())]  # fmt: skip
                with app.db.connection() as conn:  # what it held: a source moved is the root
                    before = app.aggregate_states.load(conn, published.name, sorted(encoded))
                publish_stored(published.publish, published.name, rows, published is not agg,
                               before)  # fmt: skip
        if self.delta is not None:
            rows = [(n, key, encoded[0]) for n, entries in states.items()
                    for key, encoded in entries.items()]  # fmt: skip
            self.delta.merge(rows, {s: t.position for s, t in current.items()}, end)
        with app.db.transaction() as conn:
            self.record_batch(conn, end)
            for name in states:
                save_states(app, conn, name, states)
            for record in self.records:  # fenced: a stolen claim fails the whole commit
                # advance keeps what lies past ``end`` (a reset's replay ends, per part)
                token = current.get(record.segment.id, Token(0)).advance(end)
                app.tokens.store(agg.name, record.segment.id, token, self.owner, conn=conn)
        return True

    def record_batch(self, conn: Any, end: int) -> None:
        """The batch's row in ``spark_batches``, in its transaction."""
        db, name = self.app.db, self.agg.name
        next_id = db.sql(f"SELECT coalesce(max(batch_id), -1) + 1 FROM {self.batches} "
                         "WHERE aggregation = ?")  # fmt: skip
        (batch_id,) = conn.execute(next_id, (name,)).fetchone()
        conn.execute(
            db.sql(f"INSERT INTO {self.batches} (aggregation, batch_id, end_position) "
                   "VALUES (?, ?, ?)"), (name, batch_id, end),
        )  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._beat is not None:
            self._beat.stop()
        release_all(self.app.tokens, self.agg.name, self.owner, self.records)
        self.records = []


def plan(app: Any, names: list[str]) -> tuple[list[str], list[str]]:
    """Which processors ``run --engine spark`` runs (aggregations) and which it does not."""
    wanted = names or list(app.processors)
    runs = [n for n in wanted if isinstance(app.get(n), Aggregation)]
    skipped = [n for n in wanted if n not in runs]
    if names and skipped:
        raise InvalidInputError(
            f"--engine spark runs aggregations; {', '.join(map(repr, skipped))} "
            "is not one: run it with --engine local"
        )
    if not runs:
        raise InvalidInputError("--engine spark runs aggregations, and this app defines none")
    return runs, skipped


def run(
    app: Any,
    names: list[str],
    master: str | None = None,
    spark: Any = None,
    conf: dict[str, str] | None = None,
    py_files: Any = (),
    archives: Any = (),
    remote: str | None = None,
    delta: Mapping[str, str] | None = None,
    delta_options: Mapping[str, str] | None = None,
    **options: Any,
) -> None:
    """``eventlanes run APP --engine spark``: run until SIGINT/SIGTERM, then stop cleanly.
    ``delta``: aggregation name -> the Delta table kept current."""
    names, _ = plan(app, names)
    tables = dict(delta or {})
    if spark is None and master:
        executor_url(app.url, master)  # a store executors cannot see: refused before a JVM
    spark = spark or get_session(master, conf=conf, py_files=py_files, archives=archives,
                                 remote=remote)  # fmt: skip
    runners = [
        ContinuousAggregation(
            app, n, spark=spark, delta=tables.get(n), delta_options=delta_options, **options
        )
        for n in names
    ]

    def failed() -> bool:
        for runner in runners:
            if runner.error is not None:
                if isinstance(runner.error, EventlanesError):
                    raise runner.error
                error = first_line(runner.error)
                raise SparkJobError(f"{runner.agg.name}: a micro-batch failed: {error}")
        return False

    try:
        for runner in runners:
            runner.start()
        run_until_signal(threading.Event(), failed)
    finally:
        for runner in runners:
            runner.stop()
