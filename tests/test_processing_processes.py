"""Processors across real processes: SIGKILL chaos, `run --processes`, CLI steering."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import eventlanes as el
from tests.apps.recorder import create_schema
from tests.processing_helpers import (
    Logged,
    assert_exactly_once_in_order,
    kill_again_and_again,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.recorder:app"


def _env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"EVENTLANES_TEST_APP_URL": url, "EVENTLANES_TEST_APP_CLAIM_TIMEOUT": "1.5"})
    env.update({f"EVENTLANES_TEST_APP_{k.upper()}": v for k, v in extra.items()})
    return env


def _worker(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress", *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _append_in_background(store: el.EventStore, total: int, streams: int) -> threading.Thread:
    def load() -> None:
        rng = random.Random(42)
        for _ in range(total // 50):
            store.append(f"s-{rng.randrange(streams)}", [el.NewEvent("Step")] * 50)
            time.sleep(0.0005)  # interleave with the workers

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def test_chaos_sigkill_workers_exactly_once(store_url: str) -> None:
    """Workers are SIGKILLed at random while 200,000 events arrive; the projection ends equal
    to the reference: every event handled once, each stream in order."""
    app = el.App(store_url, claim_timeout=1.5)
    app.processor("recorder", segments=4)
    table = create_schema(app)
    env = _env(store_url, batch="500")
    loader = _append_in_background(app.store, 200_000, streams=2000)
    workers = [_worker(env) for _ in range(3)]
    kills = 0
    try:
        kills = kill_again_and_again(
            workers, lambda: _worker(env), loader.is_alive, 6, pause=(0.8, 1.6), seed=7
        )
        loader.join()
        app.wait_until_caught_up(180)
        # A SIGTERM that lands before a new worker has installed its handler (a worker just
        # spawned, still importing) would kill it (exit -15): wait until every worker is live,
        # which it says only once its handlers are in (see the test below).
        wait_for(
            lambda: all(
                any(f":{p.pid}:" in n for n in app.tokens.live_nodes("recorder")) for p in workers
            ),
            timeout=60, what="every worker to be up",
        )  # fmt: skip
    finally:
        _stop(workers)
    for p in workers:
        assert p.returncode == 0, p.stderr.read() if p.stderr else ""
    assert kills >= 6
    assert assert_exactly_once_in_order(app, table) == 200_000


def test_a_worker_stopped_as_soon_as_it_is_live_stops_cleanly(tmp_path) -> None:
    """A runner says it is live (its heartbeat) only once its SIGTERM handler is installed:
    a SIGTERM sent the moment it shows up in live_nodes stops it cleanly (exit 0), never by
    the default action (exit -15)."""
    url = f"sqlite:///{tmp_path}/live.db"
    app = el.App(url, claim_timeout=1.5)
    app.processor("recorder", segments=4)
    create_schema(app)
    for _ in range(3):
        worker = _worker(_env(url))
        try:
            wait_for(lambda w=worker: any(f":{w.pid}:" in n  # fmt: skip
                                          for n in app.tokens.live_nodes("recorder")),
                     timeout=60, interval=0.001, what="the worker to be live")  # fmt: skip
            worker.send_signal(signal.SIGTERM)
        finally:
            if worker.poll() is None:
                worker.wait(60)
        assert worker.returncode == 0, worker.stderr.read() if worker.stderr else ""


def test_workers_killed_while_sending_logs_leave_the_others_logging_and_the_stop_clean(
    tmp_path: Path,
) -> None:
    """The workers send their log records to the supervisor. Two workers are SIGKILLed while
    they write records into a full pipe (the supervisor is held by SIGSTOP): their
    replacements' records still reach the supervisor, and SIGTERM still stops it cleanly.
    (With one queue shared by every worker, a worker killed while writing held its lock for
    ever: no worker's record arrived again, and the supervisor hung at its stop.)"""
    url = f"sqlite:///{tmp_path}/chatty.db"
    app = el.App(url, claim_timeout=1.5)
    app.processor("recorder", segments=2)
    create_schema(app)
    for i in range(100):
        app.store.append(f"s-{i}", [el.NewEvent("Step")] * 100)
    env = _env(url, segments="2", batch="5", log_bytes="500")
    args = [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress", "--processes",
            "2", "--max-restarts", "2", "--grace", "8"]  # fmt: skip
    sup = Logged(args, tmp_path, "supervisor", cwd=ROOT, env=env, start_new_session=True)
    proc = sup.process
    try:
        first = wait_for(lambda: len(nodes := app.tokens.live_nodes("recorder")) == 2 and nodes,
                         timeout=60, what="two workers")  # fmt: skip
        wait_for(lambda: "handled" in sup.err(), timeout=30, what="the workers' records")
        os.kill(proc.pid, signal.SIGSTOP)  # nobody reads the records: their pipe fills
        time.sleep(1.0)
        killed = {int(node.split(":")[1]) for node in first}
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)

        def replacements_logged() -> bool:
            err = sup.err()
            pids = {p for n in app.tokens.live_nodes("recorder") if (p := int(n.split(":")[1]))
                    not in killed}  # fmt: skip
            return len(pids) == 2 and all(f":{p}:" in err and "claimed" in err for p in pids)

        wait_for(replacements_logged, timeout=60, what="the replacements' records")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert proc.returncode == 0, sup.err()[-3000:]
        assert "stopped cleanly: every worker is done" in sup.err()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_run_processes_with_splits_and_merges_keeps_order(store_url: str) -> None:
    """4 segments x 2 worker processes (`run --processes 2`), split and merged while running."""
    app = el.App(store_url, claim_timeout=1.5)
    app.processor("recorder", segments=4)
    table = create_schema(app)
    env = _env(store_url, batch="100")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--processes", "2", "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: len(app.tokens.live_nodes("recorder")) == 2, timeout=60, what="2 workers")
        loader = _append_in_background(app.store, 20_000, streams=300)
        for seg_id in (0, 1, 2):
            wait_for(lambda: all(s.owner for s in app.status("recorder").segments), timeout=30)
            print(app.split("recorder", seg_id, timeout=30))
        for seg_id in (4, 5):
            print(app.merge("recorder", seg_id, timeout=30))
        loader.join()
        app.wait_until_caught_up(120)
        wait_for(  # both processes work, all segments held
            lambda: len({s.owner for s in app.status("recorder").segments} - {None}) == 2
            and all(s.owner for s in app.status("recorder").segments),
            timeout=20, what="both workers holding segments",
        )  # fmt: skip
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(60)
    assert supervisor.returncode == 0, supervisor.stderr.read() if supervisor.stderr else ""
    assert assert_exactly_once_in_order(app, table) == 20_000
    assert len(app.status("recorder").segments) == 5


@pytest.mark.parametrize("backend", ["sqlite"])
def test_cli_status_reset_steering_and_dead_letters(store_url: str) -> None:
    env = _env(store_url)
    app = el.App(store_url)
    app.processor("recorder", segments=4)
    create_schema(app)
    app.store.append("s", [el.NewEvent("Step")] * 3)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    out = cli("status", APP)
    assert out.returncode == 0 and "recorder: head 3" in out.stdout and "0/3" in out.stdout
    out = cli("split", APP, "recorder", "1")
    assert out.returncode == 0 and "split 1/3 into 1/7 and 5/7" in out.stdout
    out = cli("merge", APP, "recorder", "5")
    assert out.returncode == 0 and "merged 5/7 and 1/7 into 1/3" in out.stdout
    out = cli("merge", APP, "recorder", "9")
    assert out.returncode == 2 and "has no segment 9" in out.stdout
    out = cli("reset", APP, "recorder", "--to", "head", "--yes")
    assert out.returncode == 0 and "continues from position 3" in out.stdout
    out = cli("reset", APP, "recorder", "--to", "yesterday")
    assert out.returncode == 2 and "invalid --to 'yesterday'" in out.stdout
    out = cli("dead-letters", APP, "recorder")
    assert out.returncode == 0 and "0 dead letter(s)" in out.stdout
    out = cli("status", "tests.apps.nosuch:app")
    assert out.returncode == 2 and "cannot import 'tests.apps.nosuch'" in out.stdout
    worker = _worker(env)
    try:
        wait_for(lambda: any(s.owner for s in app.status("recorder").segments), timeout=30)
        out = cli("reset", APP, "recorder", "--yes")
        assert out.returncode == 2 and "is running" in out.stdout
    finally:
        _stop([worker])
