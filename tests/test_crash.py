"""A runner stopped by an exception it cannot handle as a failed batch (a handler raising
``KeyboardInterrupt`` or ``SystemExit``; a key function doing so) is visible: its segments'
error in ``status`` (app, ``--url``, ``--json``), no ``ready:`` line after the crash, and
``eventlanes run`` exits non-zero, in one process and with ``--processes N``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from tests.apps.crash_app import create_schema, make_app
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
CRASHES = ["KeyboardInterrupt", "SystemExit"]


def _fill(app: el.App) -> None:
    app.store.append("fine", [el.NewEvent("Order") for _ in range(3)])
    app.store.append("boom", [el.NewEvent("Order"), el.NewEvent("Order", {"crash": True})])


def _status_json(url: str) -> dict:
    result = CliRunner().invoke(main, ["status", "--url", url, "--json"])
    assert result.exit_code == 1, result.output  # unhealthy
    return json.loads(result.output)


@pytest.mark.parametrize("raises", CRASHES)
def test_a_crashed_runner_shows_its_error_in_status(store_url: str, raises: str) -> None:
    """Before: processing stopped and rolled back, but status showed no error."""
    app = make_app(store_url, raises)
    table = create_schema(app)
    _fill(app)
    app.start()
    try:
        wait_for(lambda: not app.running or any(r.error for r in app._runners), what="the crash")
    finally:
        with pytest.raises(el.ProcessorCrashedError) as caught:
            app.stop()
    assert isinstance(caught.value.__cause__, KeyboardInterrupt | SystemExit)
    assert f"processor 'orders' crashed: {raises}" in str(caught.value)
    assert "raised by handler handle at event 5 (Order, boom v2)" in str(caught.value)
    # The crashing batch rolled back: its key's rows are not written, its token did not move.
    boom = [s for s in app.status("orders").segments if s.errors]
    assert len(boom) == 1 and boom[0].position < 5
    assert f"the runner crashed: {raises}" in boom[0].last_error
    assert (5,) not in app.db.query(f"SELECT position FROM {table}")
    doc = _status_json(store_url)
    orders = doc["processors"][0]
    assert not doc["healthy"] and orders["problems"]
    assert any(raises in (s["last_error"] or "") for s in orders["segments"])
    app.close()


def test_a_key_function_that_stops_the_runner_is_recorded_on_its_segments(tmp_path) -> None:
    """Raised outside a segment's batch (while the read is shared out): every held segment
    gets the error."""
    url = f"sqlite:///{tmp_path}/k.db"
    app = el.App(url)

    def key(event: el.Event) -> str:
        if event.data.get("crash"):
            raise SystemExit(3)
        return event.stream_id

    proc = app.processor("keyed", segments=2, policy=key)
    proc.on_any(lambda event, ctx: None)
    app.store.append("s", [el.NewEvent("E"), el.NewEvent("E", {"crash": True})])
    app.start()
    try:
        wait_for(lambda: any(r.error for r in app._runners), what="the crash")
    finally:
        with pytest.raises(el.ProcessorCrashedError, match="SystemExit: 3"):
            app.stop()
    segments = app.status("keyed").segments
    assert all(s.errors == 1 and "SystemExit: 3" in s.last_error for s in segments)
    app.close()


def _run(url: str, raises: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, EVENTLANES_TEST_CRASH_URL=url, EVENTLANES_TEST_CRASH=raises)
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.crash_app:app", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("processes", ["1", "2"])
@pytest.mark.parametrize("raises", CRASHES)
def test_run_exits_non_zero_with_no_ready_line_after_a_crash(
    tmp_path, processes: str, raises: str
) -> None:
    """Before: the ready line could follow the crash; a SystemExit(0) in a handler under
    --processes made every worker exit 0 and run exit 0."""
    url = f"sqlite:///{tmp_path}/c.db"
    app = make_app(url)
    create_schema(app)
    _fill(app)
    proc = _run(url, raises, "--processes", processes, "--max-restarts", "0")
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, err
    lines = err.splitlines()
    crashed = [i for i, line in enumerate(lines) if "ERROR" in line and "crashed" in line]
    assert crashed, err
    assert not [line for line in lines[crashed[0] :] if "ready:" in line], err
    assert "processor 'orders' crashed" in out + err  # the one error line
    segments = _status_json(url)["processors"][0]["segments"]
    assert any(f"the runner crashed: {raises}" in (s["last_error"] or "") for s in segments)
    app.close()


def test_the_ready_line_still_comes_when_nothing_crashes(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/ok.db"
    app = make_app(url)
    create_schema(app)
    app.store.append("fine", [el.NewEvent("Order")])
    for processes in ("1", "2"):
        proc = _run(url, "KeyboardInterrupt", "--processes", processes)
        deadline = time.monotonic() + 60
        lines: list[str] = []
        assert proc.stderr is not None
        while time.monotonic() < deadline and not any("ready:" in line for line in lines):
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, "".join(lines) + err
        assert any("ready:" in line for line in lines), "".join(lines) + err
    app.close()
