"""The `eventlanes` command line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from tests.apps.ops_app import create_schema, fill, make_app


def test_info_shows_size_and_head(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    with el.open_store(url) as store:
        store.append("a", [el.NewEvent("A"), el.NewEvent("B")])
    result = CliRunner().invoke(main, ["info", url])
    assert result.exit_code == 0, result.output
    assert "sqlite" in result.output and "2" in result.output


def test_errors_are_one_clear_line(tmp_path) -> None:
    result = CliRunner().invoke(main, ["info", "mysql://x/y"])
    assert result.exit_code == 2
    assert "unknown store URL scheme 'mysql'" in result.output
    assert "Traceback" not in result.output


# -- dead letters per key or position, confirmation ----------------------------------------------
OPS = "tests.apps.ops_app:app"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def parked(tmp_path, monkeypatch):
    """orders ran once: the 2 events of stream ``bad`` (positions 11 and 12) are parked."""
    url = f"sqlite:///{tmp_path}/e.db"
    flag = tmp_path / "flag"
    monkeypatch.setenv("EVENTLANES_TEST_OPS_URL", url)
    monkeypatch.setenv("EVENTLANES_TEST_OPS_FLAG", str(flag))
    monkeypatch.delitem(sys.modules, "tests.apps.ops_app", raising=False)
    app = make_app(url, str(flag))
    create_schema(app)
    fill(app.store, good=10)
    app.start(["orders"])
    try:
        app.wait_until_caught_up(30, ["orders"])
    finally:
        app.stop()
    yield app, flag
    app.close()


def letters(app) -> list[tuple[str | None, int]]:
    return [(d.seq_key, d.position) for d in app.dead_letter_list("orders")]


def test_dead_letters_of_one_key_or_position(parked) -> None:
    app, flag = parked
    assert letters(app) == [("bad", 11), ("bad", 12)]
    listed = CliRunner().invoke(main, ["dead-letters", OPS, "orders", "--position", "12"])
    assert listed.exit_code == 0 and "1 dead letter(s)" in listed.output
    flag.touch()
    # A later event of a key cannot overtake an earlier parked one.
    refused = CliRunner().invoke(
        main, ["dead-letters", OPS, "orders", "--retry", "--position", "12"]
    )
    assert refused.exit_code == 2 and "waits behind position 11" in refused.output
    assert letters(app) == [("bad", 11), ("bad", 12)]
    one = CliRunner().invoke(main, ["dead-letters", OPS, "orders", "--retry", "--position", "11"])
    assert one.exit_code == 0 and "1 event(s) handled, 0 still parked" in one.output
    assert letters(app) == [("bad", 12)]
    rows = app.db.query(f"SELECT position FROM {app.db.table('handled')} WHERE stream_id = 'bad'")
    assert rows == [(11,)]


def test_discard_asks_first_and_refuses_without_a_terminal(parked) -> None:
    app, _ = parked
    # CliRunner's stdin is not a terminal: no one to ask, so it refuses.
    result = CliRunner().invoke(main, ["dead-letters", OPS, "orders", "--discard"])
    assert result.exit_code == 2 and "error:" in result.output and "--yes" in result.output
    assert len(letters(app)) == 2
    result = CliRunner().invoke(
        main, ["dead-letters", OPS, "orders", "--discard", "--key", "nope", "--yes"]
    )
    assert result.exit_code == 0 and "no dead letters" in result.output
    result = CliRunner().invoke(
        main, ["dead-letters", OPS, "orders", "--discard", "--key", "bad", "--yes"]
    )
    assert result.exit_code == 0 and "discarded 2 event(s)" in result.output
    assert letters(app) == []


def test_discard_confirmation_on_a_terminal(parked, tmp_path) -> None:
    """On a real terminal (a pty) --discard asks; "n" keeps the letters, "y" drops them."""
    import pty

    app, flag = parked
    url = str(app.url)
    for answer, kept in ((b"n\n", 2), (b"y\n", 0)):
        master, slave = pty.openpty()
        env = dict(os.environ, EVENTLANES_TEST_OPS_URL=url, EVENTLANES_TEST_OPS_FLAG=str(flag))
        proc = subprocess.Popen(
            [sys.executable, "-m", "eventlanes.cli", "dead-letters", OPS, "orders", "--discard"],
            cwd=ROOT, env=env, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        os.close(slave)
        os.write(master, answer)
        out, _ = proc.communicate(timeout=60)
        os.close(master)
        assert b"Discard 2 parked event(s) of orders (all keys) for good?" in out, out
        assert proc.returncode == (1 if kept else 0), out
        assert len(letters(app)) == kept


# -- reset: asks first, says what it replays ---------------------------------------------------
def orders_tokens(app) -> list:
    return [s.token for s in app.status("orders").segments]


def test_reset_says_what_it_replays_warns_and_refuses_without_a_terminal(parked) -> None:
    app, _ = parked
    before = orders_tokens(app)
    result = CliRunner().invoke(main, ["reset", OPS, "orders"])  # stdin is not a terminal
    assert result.exit_code == 2, result.output
    assert "replays 12 event(s) handled before" in result.output
    assert "0 event(s) after position 0 are handled for the first time" in result.output
    # orders writes rows through ctx and has no on_reset handler to clear them first.
    assert "warning:" in result.output and "written a second time" in result.output
    assert "error:" in result.output and "--yes" in result.output
    assert orders_tokens(app) == before  # nothing was reset
    result = CliRunner().invoke(main, ["reset", OPS, "orders", "--yes"])
    assert result.exit_code == 0, result.output
    assert "orders: reset; replays 12 event(s) from position 0 on the next run" in result.output
    assert all(t.replay_until == 12 for t in orders_tokens(app))
    # Replaying nothing says so (and a processor that never ran has nothing to replay).
    for args in (["orders", "--to", "head"], ["audit"]):
        result = CliRunner().invoke(main, ["reset", OPS, *args, "--yes"])
        assert result.exit_code == 0, result.output
        assert "the reset replays nothing" in result.output and "warning" not in result.output
        assert "reset; nothing to replay; continues from position" in result.output
    assert all(t == el.Token(12) for t in orders_tokens(app))


def test_reset_confirmation_on_a_terminal_and_refusal_on_a_pipe(parked) -> None:
    """On a real terminal (a pty) reset asks: "n" keeps the tokens, "y" resets. A pipe is no
    terminal, even when it says "y": refused, nothing reset."""
    import pty

    app, flag = parked
    env = dict(os.environ, EVENTLANES_TEST_OPS_URL=str(app.url), EVENTLANES_TEST_OPS_FLAG=str(flag))
    command = [sys.executable, "-m", "eventlanes.cli", "reset", OPS, "orders"]
    before = orders_tokens(app)
    piped = subprocess.run(command, cwd=ROOT, env=env, input=b"y\n", capture_output=True,
                           timeout=60)  # fmt: skip
    assert piped.returncode == 2 and b"no terminal to ask on" in piped.stdout, piped.stdout
    assert orders_tokens(app) == before
    for answer, reset in ((b"n\n", False), (b"y\n", True)):
        master, slave = pty.openpty()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        os.close(slave)
        os.write(master, answer)
        out, _ = proc.communicate(timeout=60)
        os.close(master)
        assert b"replays 12 event(s)" in out and b"Reset orders to position 0?" in out, out
        assert proc.returncode == (0 if reset else 1), out
        assert (orders_tokens(app) != before) == reset


# -- logs --------------------------------------------------------------------------------------
def _run(url: str, flag: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, EVENTLANES_TEST_OPS_URL=url, EVENTLANES_TEST_OPS_FLAG=flag)
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _until(proc: subprocess.Popen, lines: list[str], *wanted: str, timeout: float = 60) -> None:
    """Read log lines until each of ``wanted`` appeared (in any order)."""
    deadline = time.monotonic() + timeout
    missing = set(wanted)
    assert proc.stderr is not None
    while missing and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        missing = {w for w in missing if w not in line}
    assert not missing, f"no {missing} in {''.join(lines)}"


def test_run_without_a_terminal_logs_start_and_ready_lines(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    app = make_app(url)
    create_schema(app)
    fill(app.store, good=5)
    proc = _run(url, "", "run", OPS, "--processor", "orders")
    lines: list[str] = []
    try:
        _until(proc, lines, "ready:", "parking event")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        app.close()
    text = "".join(lines)
    assert proc.returncode == 0, err
    assert (
        "INFO eventlanes.cli: orders: starting (pooled, 2 segment(s), on_error=dead_letter)" in text
    )
    assert "at position 0, head 7, lag 7" in text
    # Timestamped (UTC, ISO 8601) lines with their level, also for warnings.
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.search(stamp + r" WARNING eventlanes\.processing: orders 1/1: parking event 6", text)
    assert re.search(stamp + r" INFO eventlanes\.cli: ready: 1 processor\(s\) running", text)
    assert out == ""  # logs go to stderr


def test_worker_process_logs_come_out_formatted_as_json(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    app = make_app(url)
    create_schema(app)
    fill(app.store, good=5)
    proc = _run(url, "", "--log-format", "json", "run", OPS, "--processor", "orders",
                "--processes", "2")  # fmt: skip
    lines: list[str] = []
    try:
        _until(proc, lines, "ready:", "parking event")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        app.close()
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in lines + err.splitlines() if line.strip()]
    parking = [r for r in records if "parking event 6" in r["message"]]
    assert parking and parking[0]["level"] == "WARNING" and parking[0]["time"].endswith("Z")
    assert parking[0]["process"] != proc.pid  # it came from a worker process
    assert any(r["message"].startswith("ready: 2 worker process(es)") for r in records)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_module_with_a_syntax_error_is_one_line(tmp_path, processes: str) -> None:
    (tmp_path / "broken_app.py").write_text(
        'import eventlanes as el\napp = el.App("sqlite:///x.db"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "run", "broken_app:app", "--processes",
         processes, "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot import 'broken_app'")
    assert "syntax error at" in lines[0] and "broken_app.py:2" in lines[0]
