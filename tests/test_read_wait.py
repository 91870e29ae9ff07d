"""PostgreSQL readers held back by a client's open transaction, and a frozen server, for real:
every status path (the app, ``status --url``, ``--json``, metrics, the dashboard) shows the lag
to the committed head and names the transaction; the wait, and the freeze, are logged when
they start and when they end."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from eventlanes.store.base import READ_WAIT_WARNING
from tests.apps.wait_app import create_schema, make_app
from tests.processing_helpers import wait_for
from tests.test_metrics import free_port, scrape, total

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.wait_app:app"
E = el.NewEvent


@pytest.fixture
def wait_url(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh store, and the app module the CLI loads imported afresh for it with its store
    opened: opening a store runs its DDL, whose ``CREATE INDEX IF NOT EXISTS`` itself waits
    for a transaction that appended (the open transaction below) to end."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}prefix=w{uuid.uuid4().hex[:10]}_"
    monkeypatch.setenv("EVENTLANES_TEST_WAIT_URL", url)
    monkeypatch.delitem(sys.modules, "tests.apps.wait_app", raising=False)
    module = importlib.import_module("tests.apps.wait_app")
    create_schema(module.app)
    yield url
    module.app.close()


def cli_status(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["status", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _up(url: str) -> bool:
    try:
        return bool(_get(url))
    except OSError:
        return False


@pytest.fixture
def dashboard(wait_url: str) -> Iterator[str]:
    """``eventlanes dashboard`` of the wait app, in its own process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "dashboard", APP, "--port", str(port)],
        cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: proc.poll() is not None or _up(base), 60, what="the dashboard")
        assert proc.poll() is None, proc.communicate()[0]
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_status_names_the_open_transaction_readers_wait_behind_on_every_path(
    wait_url: str, pg_url: str, dashboard: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventlanes")
    app = make_app(wait_url)
    app.store.append("early", [E("Placed")] * 20)
    app.start(metrics_port=0)
    client = psycopg.connect(pg_url, application_name="slow-client")
    try:
        app.wait_until_caught_up(30)
        assert _get(dashboard + "api/status")  # its store is open (see wait_url)
        # A client appends inside its own transaction and keeps it open; others go on.
        app.store.append("held", [E("Placed")] * 3, conn=client)
        for i in range(30):
            app.store.append(f"later-{i}", [E("Placed")])
        committed = app.store.committed_head()
        readable = app.store.head()
        assert committed > readable
        app.wait_until_caught_up(30)  # as far as readers can go: up to the open transaction

        view = app.status("orders")
        assert (view.head, view.readable_head) == (committed, readable)
        assert view.lag == committed - view.position > 0 and not view.caught_up
        wait = view.read_wait
        assert wait is not None and wait.pid == client.info.backend_pid
        assert wait.application_name == "slow-client" and wait.transaction_age is not None
        young = wait.age < READ_WAIT_WARNING

        # Every path says the same: the app module, the store URL alone, metrics, dashboard.
        _, by_app = cli_status(APP)
        _, by_url = cli_status("--url", wait_url)
        api = json.loads(_get(dashboard + "api/status"))
        for doc in (by_app, by_url, api):
            p = doc["processors"][0]
            assert (p["head"], p["readable_head"], p["lag_events"]) == (
                committed, readable, committed - view.position
            ), doc  # fmt: skip
            assert p["caught_up"] is False and p["lag_seconds"] > 0
            assert p["read_wait"]["pid"] == wait.pid
            assert p["read_wait"]["application_name"] == "slow-client"
            assert p["read_wait"]["readable_head"] == readable
            if young:  # named, but not yet a problem
                assert p["healthy"] and any("slow-client" in n for n in p["notes"])
        # The page shows the dashboard's own polls (every --refresh seconds): the next one.
        wait_for(lambda: f"pid {wait.pid}" in _get(dashboard + "fragment"), 10,
                 what="the dashboard's page to name the transaction")  # fmt: skip
        samples = scrape(app.metrics_port)
        assert total(samples, "eventlanes_head_position") == committed
        assert total(samples, "eventlanes_readable_head_position") == readable
        assert total(samples, "eventlanes_lag_events", processor="orders") > 0
        assert total(samples, "eventlanes_read_wait_seconds", pid=str(wait.pid),
                     application_name="slow-client") > 0  # fmt: skip

        # Past the threshold: a problem on every path, and one warning in the runner's log.
        wait_for(lambda: app.status("orders").read_wait.age >= READ_WAIT_WARNING,  # type: ignore[union-attr]
                 timeout=30, what="the transaction to pass the threshold")  # fmt: skip
        for code, doc in (cli_status(APP), cli_status("--url", wait_url)):
            p = doc["processors"][0]
            assert code == 1 and not p["healthy"]
            assert any(f"pid {wait.pid}" in problem for problem in p["problems"]), p
        wait_for(lambda: _warnings(caplog, "event store: readers wait at position"), timeout=15,
                 what="the warning")  # fmt: skip
        time.sleep(3)  # more heartbeats: still one warning
        [warning] = _warnings(caplog, "event store: readers wait at position")
        assert f"pid {wait.pid}" in warning and "slow-client" in warning
    finally:
        client.commit()
        client.close()
    try:
        app.wait_until_caught_up(30)
        view = app.status("orders")
        assert view.read_wait is None and view.caught_up and view.lag == 0
        wait_for(lambda: _warnings(caplog, "readers go on"), timeout=15, what="the end logged")
    finally:
        app.stop()
        app.close()


def _server_processes(server: object) -> list[int]:
    """The postmaster of the embedded server and its children (the backends, the writers)."""
    data = Path(server.data)  # type: ignore[attr-defined]
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(entry.name))
    return [postmaster, *children]


def test_a_frozen_server_is_logged_once_when_it_starts_and_once_when_it_ends(
    pg_server: object, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventlanes")
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}prefix=f{uuid.uuid4().hex[:10]}_"
    app = make_app(url, claim_timeout=3.0)
    create_schema(app)
    app.store.append("before", [E("Placed")] * 50)
    app.start()
    try:
        app.wait_until_caught_up(30)
        frozen = _server_processes(pg_server)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(8.0)  # well past the heartbeat's 5 s
        finally:
            for pid in reversed(frozen):
                os.kill(pid, signal.SIGCONT)
        app.store.append("after", [E("Placed")] * 50)
        app.wait_until_caught_up(60)
        wait_for(lambda: _warnings(caplog, "database back after"), timeout=30,
                 what="the end of the freeze logged")  # fmt: skip
        time.sleep(2)  # more heartbeats: nothing more is logged
    finally:
        app.stop()
    [started] = _warnings(caplog, "has not answered")
    [ended] = _warnings(caplog, "database back after")
    assert started.startswith("orders: heartbeat: the database has not answered for")
    assert ended.startswith("orders: heartbeat: database back after")
    seen = [r[0] for r in app.db.query(f"SELECT position FROM {app.db.table('seen')}")]
    assert sorted(seen) == [e.position for e in app.store.iter_events()]  # exactly once
    app.close()


def test_wait_for_an_event_past_the_horizon_waits_instead_of_failing(
    wait_url: str, pg_url: str
) -> None:
    """Before: ``app.wait_for(name, positions)`` read the events at once; a committed event
    still past the readers' horizon (another append in flight below it) read as missing:
    "no event at position N", seen once under steady appends. Now it is read when the
    horizon passes it, within the timeout; a position past the committed head is still an
    error at once."""
    import threading

    app = make_app(wait_url)
    app.start()
    client = psycopg.connect(pg_url, application_name="slow-client")
    try:
        app.store.append("held", [E("Placed")], conn=client)  # in flight, below the next one
        mine = app.store.append("mine", [E("Placed")])
        assert app.store.head() < mine[0] <= app.store.committed_head()
        threading.Timer(1.0, client.commit).start()
        app.wait_for("orders", mine, timeout=30)
        seen = app.db.query(f"SELECT position FROM {app.db.table('seen')}")
        assert mine[0] in {p for (p,) in seen}
        with pytest.raises(el.InvalidInputError, match="no event at position 999999"):
            app.wait_for("orders", [mine[0], 999_999], timeout=5)
    finally:
        client.close()
        app.stop()
