"""Processing through a PostgreSQL restart, for real: a private server is stopped with
``pg_ctl stop -m immediate`` for 8 s and started again on the same port while
``eventlanes run --processes 2`` works, idles, or while writers append. The workers never
exit; they resume by themselves, and the projection ends exact: 0 lost, 0 doubled, 0 out of
order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import eventlanes as el
from tests.apps.recorder import create_schema, record
from tests.conftest import mounted_tmpfs
from tests.processing_helpers import (
    append_load,
    ask_workers_for_stacks,
    assert_exactly_once_in_order,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
CLAIM_TIMEOUT = 1.5
DOWN = 8.0


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    from eventlanes.testing.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(fsync=False, max_connections=60)
    try:
        yield pg
    finally:
        pg.stop()


def _workers(url: str, *more: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        {"EVENTLANES_TEST_APP_URL": url, "EVENTLANES_TEST_APP_CLAIM_TIMEOUT": str(CLAIM_TIMEOUT)}
    )
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.recorder:app",
         "--processes", "2", "--no-progress", "--grace", "10", *more],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _caught_up(app: el.App) -> bool:
    try:
        return app.status("recorder").caught_up
    except el.StoreConnectionError:  # the server is down: not yet
        return False


def _position(app: el.App) -> int | None:
    try:
        return app.status("recorder").position
    except el.StoreConnectionError:
        return None


def _restart(server, seconds: float = DOWN) -> float:
    server.halt("immediate")
    time.sleep(seconds)
    server.start()
    return time.monotonic()


def _where(app: el.App, workers: subprocess.Popen) -> str:
    """Each segment's position, owner and error; how far readers may read (the visibility
    horizon) and whom they wait behind; the database's sessions (what each waits on); then the
    workers' stacks (asked for by SIGUSR1) and log, once stopped (a run once saw every segment
    stand still, without an error, for 13 s after the restart)."""
    status = app.status("recorder")
    segments = [(str(s.segment), s.position, s.owner, s.last_error) for s in status.segments]
    sessions = app.db.query(
        """SELECT pid, application_name, state, wait_event_type, wait_event,
                  extract(epoch FROM clock_timestamp() - xact_start)::int, left(query, 100)
           FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"""
    )
    readable, behind = app.store.head(), app.store.read_wait()  # below the visibility horizon
    ask_workers_for_stacks(workers)
    workers.send_signal(signal.SIGTERM)
    _, err = workers.communicate(timeout=60)
    rows = "\n".join(map(str, sessions))
    return (f"at {status.position} of {status.head} (readable: {readable}, readers wait "
            f"behind: {behind}); segments {segments}; sessions:\n{rows}\n"
            f"the workers' stacks and log:\n{err[-16000:]}")  # fmt: skip


def _stop(workers: subprocess.Popen) -> str:
    if workers.poll() is not None:
        out, err = workers.communicate()
        raise AssertionError(f"the workers exited: {out}{err}")
    workers.send_signal(signal.SIGTERM)
    out, err = workers.communicate(timeout=60)
    # stdout too: a worker's `error:` line is written there (a worker that exited 2 once, with
    # nothing on stderr to say why)
    assert workers.returncode == 0, f"{out}\n{err}"
    return err


def test_restart_while_working(server) -> None:  # type: ignore[no-untyped-def]
    url = f"{server.url}?prefix=busy_&pool_timeout=2"
    app = el.App(url, claim_timeout=CLAIM_TIMEOUT)
    app.processor("recorder", segments=4)
    table = create_schema(app)
    append_load(app.store, streams=500, events=100_000, seed=3)
    head = app.store.head()
    workers = _workers(url)
    try:
        wait_for(lambda: app.status("recorder").position > head // 10, timeout=90,
                 what="the workers busy")  # fmt: skip
        back = _restart(server)
        before = wait_for(lambda: _position(app), timeout=10, what="the status readable")
        wait_for(lambda: (_position(app) or 0) > before, timeout=CLAIM_TIMEOUT + 10,
                 what="processing resumed by itself")  # fmt: skip
        resumed = time.monotonic() - back
        wait_for(lambda: _caught_up(app), timeout=120, what="caught up again")
        caught_up = time.monotonic() - back
        err = _stop(workers)
    finally:
        if workers.poll() is None:
            workers.kill()
    assert "database unavailable" in err  # it was noticed, logged, and waited out
    assert_exactly_once_in_order(app, table)
    print(f"working: resumed {resumed:.1f} s, caught up {caught_up:.1f} s after the restart")
    app.close()


def test_restart_while_idle_and_writers_append(server) -> None:  # type: ignore[no-untyped-def]
    url = f"{server.url}?prefix=idle_&pool_timeout=2"
    app = el.App(url, claim_timeout=CLAIM_TIMEOUT)
    app.processor("recorder", segments=4)
    table = create_schema(app)
    append_load(app.store, streams=50, events=2000, seed=4)
    workers = _workers(url)
    written = {"n": 0, "refused": 0}
    stop = threading.Event()

    def writer() -> None:  # appends before, through and after the outage, retrying
        store = el.open_store(url)
        i = 0
        while not stop.is_set():
            try:
                store.append(f"w-{i % 40}", [el.NewEvent("Step")] * 5)
                written["n"] += 5
                i += 1
            except el.DatabaseUnavailableError:
                written["refused"] += 1
                time.sleep(0.2)
            time.sleep(0.01)
        store.close()

    try:
        wait_for(lambda: _caught_up(app), timeout=60, what="idle at the head")
        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(1.0)
        back = _restart(server)
        time.sleep(2.0)
        stop.set()
        thread.join()
        try:
            wait_for(lambda: _caught_up(app), timeout=CLAIM_TIMEOUT + 10, what="caught up again")
        except AssertionError as exc:  # where each stood, what the server and workers did
            raise AssertionError(f"{exc}, {time.monotonic() - back:.1f} s after the restart: "
                                 f"{_where(app, workers)}") from None  # fmt: skip
        resumed = time.monotonic() - back
        _stop(workers)
    finally:
        stop.set()
        if workers.poll() is None:
            workers.kill()
    assert written["refused"] > 0 and written["n"] > 0  # the outage was real for writers too
    assert_exactly_once_in_order(app, table)
    print(f"idle + writers: caught up {resumed:.1f} s after the restart")
    app.close()


def test_workers_that_start_during_an_outage_are_replaced_and_do_the_work(server) -> None:  # type: ignore[no-untyped-def]
    """The database goes down right after `run --processes 2` checked it, while its workers
    start. Before: each worker stopped with exit code 2, as on a user error (a bad module),
    never replaced, and the supervisor said nothing until it was stopped (a worker of
    test_restart_while_working was lost so, once). Now they are replaced after a back-off
    and do the work."""
    url = f"{server.url}?prefix=starting_&pool_timeout=2"
    app = el.App(url, claim_timeout=CLAIM_TIMEOUT)
    app.processor("recorder", segments=4)
    create_schema(app)
    append_load(app.store, streams=50, events=2_000, seed=5)
    workers = _workers(url, "--max-restarts", "20")
    halted = False
    try:
        lines = []
        assert workers.stderr is not None
        for line in workers.stderr:  # the supervisor checked the store: its workers start now
            lines.append(line)
            if "recorder: starting (" in line:
                server.halt("immediate")
                halted = True
                break
        # down until a worker failed on it (however slow it starts); stopped if none does
        guard = threading.Timer(120, workers.terminate)
        guard.start()
        for line in workers.stderr:
            lines.append(line)
            if "restarting in" in line:
                break
        guard.cancel()
        server.start()
        halted = False
        wait_for(lambda: _caught_up(app), timeout=120, what="the work done after the outage")
    finally:
        if halted:  # the module's other tests need it
            server.start()
        workers.send_signal(signal.SIGTERM)
        out, err = workers.communicate(timeout=60)
    log = "".join(lines) + err
    assert workers.returncode == 0, f"{out}\n{log}"
    assert "restarting in" in log and "the database is unavailable" in log, log


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(server, caplog) -> None:  # type: ignore[no-untyped-def]
    """Not once per retry: the runner, its heartbeat and the LISTEN connection each say when
    the database went away and when it came back."""
    import logging

    caplog.set_level(logging.INFO, logger="eventlanes")
    url = f"{server.url}?prefix=once_&pool_timeout=2"
    app = el.App(url, claim_timeout=CLAIM_TIMEOUT)
    app.processor("recorder", segments=2).on_any(record)
    table = create_schema(app)
    append_load(app.store, streams=20, events=300, seed=5)
    app.start()

    def lines(start: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]

    try:
        app.wait_until_caught_up(30)
        _restart(server, seconds=6.0)
        wait_for(lambda: lines("recorder: database back after") and lines(
            "recorder: heartbeat: database back after") and lines("LISTEN connection back"),
                 timeout=60, what="the ends of the outage logged")  # fmt: skip
        append_load(app.store, streams=20, events=300, seed=6)
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    for who in ("recorder: ", "recorder: heartbeat: "):
        assert len(lines(f"{who}database unavailable")) == 1, lines(who)
        assert len(lines(f"{who}database back after")) == 1, lines(who)
    assert len(lines("LISTEN connection failed")) == 1
    assert len(lines("LISTEN connection back")) == 1
    assert_exactly_once_in_order(app, table)
    app.close()


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """A 16 MB tmpfs of its own."""
    with mounted_tmpfs(tmp_path / "disk", "16m") as mount:
        yield mount


def test_sqlite_disk_full_while_processing(small_disk: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{small_disk}/events.db?busy_timeout=2000"
    app = el.App(url, claim_timeout=CLAIM_TIMEOUT)
    proc = app.processor("recorder", segments=2, batch_size=100)
    table = create_schema(app)

    app.db.run_ddl(["CREATE TABLE pad (blob BLOB)"])

    @proc.on_any
    def record(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(
            f"INSERT INTO {table} (stream_id, version, position) VALUES ({p}, {p}, {p})",
            (event.stream_id, event.version, event.position),
        )
        ctx.execute("INSERT INTO pad VALUES (randomblob(4000))")  # fills the disk fast

    append_load(app.store, streams=40, events=1500, seed=5)
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * max(0, free - 1024 * 1024))  # room for a quarter of the work
    app.start()
    try:
        wait_for(
            lambda: any("database unavailable" in r.getMessage() or "failed" in r.getMessage()
                        for r in caplog.records),
            timeout=60, what="the disk to fill up",
        )  # fmt: skip
        assert not app.status("recorder").caught_up
        filler.unlink()  # space again: processing resumes by itself
        freed = time.monotonic()
        app.wait_until_caught_up(60)
        resumed = time.monotonic() - freed
    finally:
        app.stop()
    assert app.db.query("PRAGMA integrity_check") == [("ok",)]
    assert_exactly_once_in_order(app, table)
    print(f"disk full: caught up {resumed:.1f} s after space was freed")
    app.close()
