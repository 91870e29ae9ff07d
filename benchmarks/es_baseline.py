"""Baseline: the Python ``eventsourcing`` library (9.x) measured on the same machine and databases
as eventlanes.

``append_rate`` times eventsourcing's ApplicationRecorder inserting stored events from several
processes; ``projection_rate`` times its ProjectionRunner driving a Projection whose materialised
view commits a counter increment together with the tracking record, one transaction per event.

``benchmarks/run.py`` puts these figures next to eventlanes' own in the same run (``bench`` extra).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import (
    ApplicationRecorder,
    InfrastructureFactory,
    ListenNotifySubscription,
    StoredEvent,
    Subscription,
    Tracking,
)
from eventsourcing.projection import Projection, ProjectionRunner
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteTrackingRecorder
from eventsourcing.utils import Environment, get_topic

from .common import run_processes

SHARED_STREAMS = 64
_TOPIC = "benchmarks.es_baseline:Counted"  # never resolved: the append test stays at the recorder


# ---------------------------------------------------------------------------------------------
# Settings: eventsourcing is configured only through its environment variables.


def _sqlite_path(url_or_path: str) -> str:
    path = url_or_path.removeprefix("sqlite:///")
    # SQLite table names are fixed by eventsourcing (stored_events, tracking), so a fresh table
    # means a fresh file; reusing one would also collide with the originator versions.
    if Path(path).exists():
        raise FileExistsError(f"{path} exists: pass a fresh file per call")
    return path


def _postgres_env(url: str, schema: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_HOST": str(info.get("host") or "localhost"),
        "POSTGRES_PORT": str(info.get("port") or "5432"),
        "POSTGRES_USER": str(info.get("user") or "postgres"),
        # The factory insists on a password key; an empty one is fine with trust auth.
        "POSTGRES_PASSWORD": str(info.get("password") or ""),
        "POSTGRES_DBNAME": str(info.get("dbname") or "postgres"),
        "POSTGRES_SCHEMA": schema,
    }


def _schema_sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def _settings(backend: str, url_or_path: str, tag: str) -> dict[str, str]:
    if backend == "sqlite":
        return {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": url_or_path}
    if backend == "postgres":
        # eventsourcing never creates schemas itself; a fresh one per call keeps runs apart.
        _schema_sql(url_or_path, f'CREATE SCHEMA "es_{tag}"')
        return _postgres_env(url_or_path, f"es_{tag}")
    raise ValueError(f"unknown backend {backend!r}: use 'sqlite' or 'postgres'")


def _drop_schema(backend: str, url_or_path: str, settings: dict[str, str]) -> None:
    if backend == "postgres":
        _schema_sql(url_or_path, f'DROP SCHEMA IF EXISTS "{settings["POSTGRES_SCHEMA"]}" CASCADE')


# ---------------------------------------------------------------------------------------------
# 1. Append rate of the ApplicationRecorder.


def _stream_id(n: int) -> UUID:
    return uuid5(NAMESPACE_URL, f"/es-baseline/stream-{n}")


def _append_worker(
    ready: Any, name: str, env: dict[str, str], writer: int, writers: int, appends: int, batch: int
) -> None:
    # Tables already exist (made by the parent): no concurrent DDL from the writers.
    factory = InfrastructureFactory.construct(Environment(name, {**env, "CREATE_TABLE": "no"}))
    recorder = factory.application_recorder()
    # Like eventlanes' writers (which keep their NewEvent dicts and encode them on every
    # append), the dicts are built once and encoded in the timed part: comparing a recorder fed
    # ready-made bytes with an append that encodes would time JSON encoding on one side only.
    datas = [{"writer": writer, "i": i} for i in range(batch)]
    calls: list[tuple[Any, int]] = []
    for k in range(appends):
        # Same stream rotation as eventlanes' benchmark: every writer hits the same 64 streams.
        stream = (writer * 7 + k) % SHARED_STREAMS
        # Versions are assigned without cross-process bookkeeping: writer w's j-th append to a
        # stream (j = k // 64) gets the version slot (j * writers + w), so streams are really
        # shared and never conflict, at the price of version gaps at the tail of a stream.
        base = ((k // SHARED_STREAMS) * writers + writer) * batch
        calls.append((_stream_id(stream), base))
    # Warm up (pool open, type adapters, prepared statements) before the timed part.
    warm = uuid5(NAMESPACE_URL, f"/es-baseline/warmup-{writer}")
    recorder.insert_events([StoredEvent(warm, 1, _TOPIC, b"{}")])
    ready.wait()
    dumps = json.dumps
    for originator, base in calls:
        stored_events = [
            StoredEvent(
                originator_id=originator,
                originator_version=base + i + 1,
                topic=_TOPIC,
                state=dumps(data).encode(),
            )
            for i, data in enumerate(datas)
        ]
        recorder.insert_events(stored_events)  # one call = one transaction
    factory.close()


def append_rate(
    backend: str, url_or_path: str, batch: int, writers: int, total_events: int
) -> float:
    """Events/s of eventsourcing's ApplicationRecorder: ``writers`` processes each inserting
    ``batch`` events per insert_events() call into 64 shared streams, ~``total_events`` in all."""
    if backend == "sqlite":
        url_or_path = _sqlite_path(url_or_path)
    tag = uuid.uuid4().hex[:12]
    # For PostgreSQL the table names derive from the environment name: unique per call too.
    name = f"esappend{tag}"
    env = _settings(backend, url_or_path, tag)
    try:
        factory = InfrastructureFactory.construct(Environment(name, env))
        recorder = factory.application_recorder()  # creates the tables, as the factory does
        appends = max(1, total_events // (batch * writers))
        seconds = run_processes(
            _append_worker, [(name, env, w, writers, appends, batch) for w in range(writers)]
        )
        events = appends * writers * batch
        # No gaps, no rollbacks: the last notification id counts every row (+1 warm-up/writer).
        assert recorder.max_notification_id() == events + writers
        factory.close()
    finally:
        _drop_schema(backend, url_or_path, env)
    return events / seconds


# ---------------------------------------------------------------------------------------------
# 2. Projection with tracking (exactly-once: counter and tracking in one transaction).


class Tally(Aggregate):
    """One stream: a Created event followed by Bumped events."""

    def __init__(self, n: int) -> None:
        self.n = n

    @event("Bumped")
    def bump(self) -> None:
        pass


class PollingSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """eventsourcing 9.5's SQLite recorder has no subscribe(), which ProjectionRunner needs.

    Its generic pull loop (ListenNotifySubscription: select_notifications in pages of 500) is
    what the PostgreSQL subscription runs too, minus LISTEN; with the events all written
    beforehand, that pull is the whole subscription."""

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        return ListenNotifySubscription(recorder=self, gt=gt, topics=topics)


class SQLiteCounterView(SQLiteTrackingRecorder):
    """Materialised view: one counter row, updated in the tracking record's transaction."""

    def construct_create_table_statements(self) -> list[str]:
        return [
            *super().construct_create_table_statements(),
            "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, count INTEGER)",
        ]

    def incr_counter(self, tracking: Tracking) -> None:
        with self.datastore.transaction(commit=True) as c:
            self._insert_tracking(c, tracking)
            self._incr(c)

    @staticmethod
    def _incr(c: SQLiteCursor) -> None:
        c.execute(
            "INSERT INTO counters VALUES ('events', 1) "
            "ON CONFLICT (name) DO UPDATE SET count = count + 1"
        )

    def get_counter(self) -> int:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT count FROM counters WHERE name = 'events'")
            row = c.fetchone()
        return row[0] if row else 0


def _postgres_counter_view() -> type:
    # Imported lazily so SQLite-only use needs no psycopg import at module load.
    from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
    from psycopg.sql import SQL, Identifier

    class PostgresCounterView(PostgresTrackingRecorder):
        """Materialised view: one counter row, updated in the tracking record's transaction."""

        def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
            super().__init__(datastore, **kwargs)
            table = self.tracking_table_name.removesuffix("_tracking") + "_counters"
            self.check_identifier_length(table)
            schema = Identifier(self.datastore.schema)
            self.sql_create_statements.append(
                SQL(
                    "CREATE TABLE IF NOT EXISTS {0}.{1} (name text PRIMARY KEY, count bigint)"
                ).format(schema, Identifier(table))
            )
            self.incr_statement = SQL(
                "INSERT INTO {0}.{1} AS t VALUES ('events', 1) "
                "ON CONFLICT (name) DO UPDATE SET count = t.count + 1"
            ).format(schema, Identifier(table))
            self.select_statement = SQL("SELECT count FROM {0}.{1} WHERE name = 'events'").format(
                schema, Identifier(table)
            )

        def incr_counter(self, tracking: Tracking) -> None:
            with self.datastore.transaction(commit=True) as curs:
                self._insert_tracking(curs, tracking)
                curs.execute(self.incr_statement, prepare=True)

        def get_counter(self) -> int:
            with self.datastore.transaction(commit=False) as curs:
                curs.execute(self.select_statement)
                row = curs.fetchone()
            return int(row["count"]) if row else 0

    return PostgresCounterView


class CountEvents(Projection[Any]):
    """Counts every event; notes when the last expected notification has been processed."""

    target = 0  # set on a per-call subclass, before the runner's thread starts

    def __init__(self, view: Any) -> None:
        super().__init__(view)
        self.done = threading.Event()
        self.finished_at = 0.0

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        self.view.incr_counter(tracking)
        if tracking.notification_id >= self.target:
            self.finished_at = time.perf_counter()
            self.done.set()


def _write_streams(
    app_cls: type[Application[UUID]], env: dict[str, str], streams: int, events_per_stream: int
) -> int:
    app = app_cls(env)
    pending: list[Tally] = []
    for n in range(streams):
        tally = Tally(n)
        for _ in range(events_per_stream - 1):
            tally.bump()
        pending.append(tally)
        if len(pending) == 100:  # untimed: a few aggregates per transaction keeps it quick
            app.save(*pending)
            pending = []
    app.save(*pending)
    last = app.recorder.max_notification_id() or 0
    app.close()
    return last


def projection_rate(
    backend: str, url_or_path: str, streams: int = 10_000, events_per_stream: int = 10
) -> tuple[int, float]:
    """(events processed, events/s) of a ProjectionRunner counting every event of a backlog of
    ``streams`` x ``events_per_stream``, committing tracking + counter once per event."""
    if backend == "sqlite":
        url_or_path = _sqlite_path(url_or_path)
    tag = uuid.uuid4().hex[:12]
    env = _settings(backend, url_or_path, tag)
    if backend == "sqlite":
        env["APPLICATION_RECORDER_TOPIC"] = get_topic(PollingSQLiteApplicationRecorder)
        view_cls: type = SQLiteCounterView
    else:
        view_cls = _postgres_counter_view()
    expected = streams * events_per_stream
    try:
        # Unique class names: PostgreSQL table names derive from them (<name>_events, ...).
        app_cls: type[Application[UUID]] = type(f"EsApp{tag}", (Application,), {})
        last = _write_streams(app_cls, env, streams, events_per_stream)
        proj_cls = type(f"EsCount{tag}", (CountEvents,), {"target": last})
        # Create the view's tables now, so the timed runner start only finds them.
        factory = InfrastructureFactory.construct(Environment(proj_cls.name, env))
        factory.tracking_recorder(view_cls)
        factory.close()

        start = time.perf_counter()
        with ProjectionRunner(
            application_class=app_cls, projection_class=proj_cls, view_class=view_cls, env=env
        ) as runner:
            projection = runner.projection
            assert isinstance(projection, CountEvents)
            while not projection.done.wait(0.5):
                if runner.is_interrupted.is_set():
                    runner.run_forever(0)  # re-raises the processing thread's error
                    raise RuntimeError("projection runner stopped early")
            seconds = projection.finished_at - start
            count = runner.view.get_counter()
            assert runner.view.max_tracking_id(app_cls.name) == last
        runner.view.datastore.close()
    finally:
        _drop_schema(backend, url_or_path, env)
    assert count == expected, (count, expected)
    return count, count / seconds
