"""Stopping is deterministic and visible: SIGINT/SIGTERM at any moment (start-up, idling,
work) end a run within its grace period; no signal handler takes a lock (a handler that sets
a ``threading.Event`` can deadlock on the lock its own thread holds inside ``Event.wait``);
``run`` says when it starts stopping and when each worker is done; a second signal ends it at
once, non-zero, and says so."""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from tests.apps.recorder import create_schema
from tests.processing_helpers import wait_for, worker_pids

ROOT = Path(__file__).resolve().parent.parent
SIGNALS_PY = ROOT / "src" / "eventlanes" / "signals.py"

# The smallest real process that runs run_until_signal: signals.py alone (stdlib only, loaded
# by path: no package import), looping start-up -> run -> stop once per signal received. The
# main thread waits in Event.wait in a tight loop (interval ~0), where it holds the Event's
# lock most of the time: the window a handler that takes that lock deadlocks in.
LOOP = r"""
import importlib.util, random, sys, threading, time
spec = importlib.util.spec_from_file_location("signals_alone", sys.argv[1])
signals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(signals)
rng = random.Random(int(sys.argv[3]))
for i in range(int(sys.argv[2])):
    how = "started"
    try:
        signals.interrupt_startup()
        print("ready", i, flush=True)
        time.sleep(rng.random() * 0.001)  # start-up: the signal may land here
        signals.run_until_signal(threading.Event(), lambda: False, 1e-6,
                                 start=lambda: time.sleep(rng.random() * 0.0005))
    except signals.StartupInterrupted:
        signals.startup_done()  # carrying on: this start-up is over
        how = "interrupted"
    print("done", i, how, flush=True)
"""


def _lines(proc: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _expect(lines: queue.Queue, prefix: str, timeout: float) -> str:
    line = lines.get(timeout=timeout)
    assert line is not None and line.startswith(prefix), line
    return line


def _stress_loop(runs: int, seed: int) -> tuple[int, int]:
    """``runs`` start-up/run/stop rounds in one process, one SIGINT or SIGTERM each at a
    random moment; fails on the first round that does not end within 2 s (a deadlock)."""
    rng = random.Random(seed)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOP, str(SIGNALS_PY), str(runs), str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = _lines(proc)
    interrupted = 0
    try:
        for i in range(runs):
            _expect(lines, f"ready {i}", 10)
            time.sleep(rng.random() * 0.01)
            proc.send_signal(rng.choice([signal.SIGINT, signal.SIGTERM]))
            try:
                done = _expect(lines, f"done {i}", 2)
            except queue.Empty:
                raise AssertionError(f"round {i} of {runs}: still running 2 s after a signal "
                                     "(a handler deadlocked?)") from None  # fmt: skip
            interrupted += done.endswith("interrupted")
        assert proc.wait(10) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return runs, interrupted


def test_signals_at_random_moments_always_stop_run_until_signal() -> None:
    """600 rounds, each stopped by a signal at a random moment of start-up or of the wait:
    every one ends (before the fix, a handler calling ``stop.set()`` deadlocked within a
    few hundred rounds)."""
    runs, interrupted = 0, 0
    for seed in (1, 2, 3):
        r, i = _stress_loop(200, seed)
        runs, interrupted = runs + r, interrupted + i
    assert runs == 600
    assert 0 < interrupted < runs  # both moments were hit: start-up and running


def _env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"EVENTLANES_TEST_APP_URL": url, "EVENTLANES_TEST_APP_CLAIM_TIMEOUT": "1.5"})
    env.update(extra)
    return env


def _sigint_at_default() -> None:
    """In the child, before exec: SIGINT at its default, as for a job of a terminal. A
    background job of a non-interactive shell (``make test &`` in a script, some CI runners)
    inherits SIGINT ignored: the interpreter then installs no KeyboardInterrupt handler, and
    a SIGINT that comes before eventlanes installs its own (importing takes 1-4 s loaded) is
    discarded by the kernel. Three loaded suite runs saw that run alive 14 s after SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(env: dict[str, str], app: str, *args: str,
         sigint: Callable[[], Any] = _sigint_at_default,
         entry: tuple[str, ...] = ("-m", "eventlanes.cli")) -> subprocess.Popen:  # fmt: skip
    """``eventlanes run`` in a session of its own: a group to send a terminal's Ctrl-C to.
    ``entry``: how Python is told to run the command (and any group option before ``run``)."""
    return subprocess.Popen(
        [sys.executable, *entry, "run", app, "--no-progress", *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint,
        start_new_session=True,
    )  # fmt: skip


#: the entry's first lines, before its signal handling is installed (a few tens of ms)
_ENTRY = tuple(f"/eventlanes/{m}.py" for m in ("__init__", "__main__", "signals", "cli/__init__",
                                               "cli/__main__", "cli/entry"))  # fmt: skip


def _ended_cleanly(proc: subprocess.Popen, sig: int, err: str) -> bool:
    """Exit 0; or, for a signal that came before Python had run any of eventlanes (the
    interpreter still starting), its default action: nothing had started."""
    if proc.returncode == 0:
        return True
    if sig == signal.SIGTERM:
        return proc.returncode == -signal.SIGTERM and not err
    # A KeyboardInterrupt before the entry's handling was in place, and only then: before,
    # one came from anywhere in the second the command line took to load (an import deep
    # in click, rich or the app).
    frames = re.findall(r'File "([^"]+)", line \d+', err)
    ours = [f for f in frames if "/eventlanes/" in f]
    return (proc.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt")
            and all(f.endswith(_ENTRY) for f in ours))  # fmt: skip


def test_real_runs_stopped_at_random_moments_exit_within_the_grace(store_url: str) -> None:
    """`eventlanes run` (one process, or two workers) is sent SIGTERM or SIGINT at a random
    moment of its start-up, its idling or its work (6,000 events to handle): every run ends
    within its grace period, exit 0, and the events handled stay handled exactly once."""
    app = el.App(store_url, claim_timeout=1.5)
    app.processor("recorder", segments=4)
    table = create_schema(app)
    for i in range(50):
        app.store.append(f"s-{i}", [el.NewEvent("Step")] * 120)
    rng = random.Random(11)
    # PYTHONFAULTHANDLER: a run still alive past its bound is sent SIGABRT, and prints every
    # thread's stack
    env = _env(store_url, EVENTLANES_TEST_APP_BATCH="5", PYTHONFAULTHANDLER="1")
    grace = 8.0
    # moments spread over 0..6 s (start-up takes 1-4 s here), jittered
    plans = [(n * 1.0 + rng.random(), rng.choice([signal.SIGINT, signal.SIGTERM]),
              ["--processes", "2"] if n % 3 == 2 else []) for n in range(6)]  # fmt: skip
    after_ready = 0
    for pair in (plans[i::2] for i in range(2)):  # three at a time, early with late
        procs = [(_run(env, "tests.apps.recorder:app", "--grace", str(grace), *args), delay, sig)
                 for delay, sig, args in pair]  # fmt: skip
        # stderr read all along: a run must never wait on a full pipe nobody reads
        logs = {proc: _drained(proc) for proc, _, _ in procs}
        started = time.monotonic()
        for proc, delay, sig in sorted(procs, key=lambda p: p[1]):
            time.sleep(max(0.0, started + delay - time.monotonic()))
            proc.send_signal(sig)
            sent = time.monotonic()
            try:
                proc.wait(grace + 6)
            except subprocess.TimeoutExpired:
                _abort(proc)
                raise AssertionError(
                    f"run still alive {grace + 6:g} s after {sig!r} (sent {delay:.1f} s after "
                    f"its start); its log and threads:\n{logs[proc]()[-8000:]}"
                ) from None
            err = logs[proc]()
            assert _ended_cleanly(proc, sig, err), (  # a string: shown whole, stacks and all
                f"exit {proc.returncode}, {sig!r} sent {delay:.1f} s after its start; its log:\n"
                f"{err[-8000:]}"
            )
            assert time.monotonic() - sent < grace + 6
            after_ready += "ready:" in err
    # nothing lost or doubled by the stops: a last run catches up
    final = _run(env, "tests.apps.recorder:app")
    final_log = _drained(final)
    try:
        wait_for(lambda: any(f":{final.pid}:" in n for n in app.tokens.live_nodes("recorder")),
                 timeout=60, what="the last run to be up")  # fmt: skip
        wait_for(lambda: app.status("recorder").lag == 0, timeout=60, what="the catch-up")
    finally:
        final.send_signal(signal.SIGTERM)
        final.wait(30)
    assert final.returncode == 0, final_log()[-3000:]
    assert after_ready > 0  # some stopped while working (or idle), not only while starting
    rows = app.db.query(f"SELECT position, COUNT(*) FROM {table} GROUP BY position")
    assert len(rows) == 6000 and all(n == 1 for _, n in rows)


def test_a_run_started_with_sigint_ignored_still_stops_on_sigint_once_it_runs(
    tmp_path: Path,
) -> None:
    """A run started as a background job of a script inherits SIGINT ignored; once its
    processors run, SIGINT still stops it cleanly, as SIGTERM does (the handlers eventlanes
    installs do not depend on what the parent left)."""
    url = f"sqlite:///{tmp_path}/ignored.db"
    app = el.App(url, claim_timeout=1.5)
    app.processor("recorder", segments=2)
    create_schema(app)
    proc = _run(_env(url), "tests.apps.recorder:app",
                sigint=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    log = _drained(proc)
    try:
        wait_for(lambda: any(f":{proc.pid}:" in n for n in app.tokens.live_nodes("recorder")),
                 timeout=60, what="the run to be live")  # fmt: skip
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log()
    assert proc.returncode == 0, err[-3000:]
    assert "SIGINT received: stopping cleanly" in err, err[-3000:]


def _read_until(lines: queue.Queue, needle: str, seen: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(needle in line for line in seen):
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {needle!r} within {timeout:g} s; log: {seen}") from None
        if line is None:
            raise AssertionError(f"ended without {needle!r}; log: {seen}")
        seen.append(line)


def _drained(proc: subprocess.Popen) -> Callable[[], str]:
    """``proc``'s stderr, read by a thread as it comes; the call gives it whole once the
    process has ended (at most 10 s more for the reader to finish)."""
    lines = _stderr_lines(proc)
    seen: list[str] = []

    def text() -> str:
        with contextlib.suppress(AssertionError):
            _read_until_end(lines, seen, 10)
        return "\n".join(seen)

    return text


def _read_until_end(lines: queue.Queue, seen: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"stderr still open after {timeout:g} s") from None
        if line is None:
            return
        seen.append(line)


def _abort(proc: subprocess.Popen) -> None:
    """SIGABRT (with PYTHONFAULTHANDLER set, the process prints every thread's stack), then
    SIGKILL to its group (the workers of ``--processes``)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _stderr_lines(proc: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _hung(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, queue.Queue, list[str]]:
    """`run` of tests/apps/hang.py with its handler hung at position 1 (a stop cannot finish
    its batch), up and working."""
    url = f"sqlite:///{tmp_path}/hang.db"
    started = tmp_path / "hanging"
    env = _env(url, EVENTLANES_TEST_HANG_AT="1", EVENTLANES_TEST_HANG_UNTIL=str(tmp_path / "never"),
               EVENTLANES_TEST_HANG_STARTED=str(started))  # fmt: skip
    app = el.App(url)
    app.processor("hang")
    proc = _run(env, "tests.apps.hang:app", "--grace", "20", *args)
    lines, seen = _stderr_lines(proc), []
    _read_until(lines, "ready:", seen, 60)
    app.store.append("s", [el.NewEvent("Step")])
    # The handler in hand (hung), not a sleep: under load a second was once not enough, and
    # both workers were idle when the signal came.
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, seen
        time.sleep(0.05)
    return proc, lines, seen


def test_ctrl_c_on_run_processes_2_is_logged_and_a_second_one_ends_it(tmp_path) -> None:
    """A Ctrl-C (SIGINT to the process group) on `run --processes 2`: the supervisor says it
    stops, and which worker is done (the idle one), while the other finishes; a second Ctrl-C
    ends it at once, exit 130, and says so in one error line."""
    proc, lines, seen = _hung(tmp_path, "--processes", "2")
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _read_until(lines, "stopping 2 worker(s)", seen, 10)
        _read_until(lines, "done, exit code 0; 1 still stopping", seen, 15)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(5)
        _read_until(lines, "error: SIGINT while stopping: 1 worker(s) killed at once", seen, 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, seen


def test_a_worker_killed_past_its_wait_leaves_its_stacks_in_the_log(tmp_path) -> None:
    """A worker still running when the supervisor's wait ends (its grace + 5 s) is killed.
    Before, nothing said where it was stuck (a fresh clone once saw a worker of
    `run --processes 2` killed so, with no clue). Now its threads' stacks come first. The
    workers here block SIGTERM, so neither can stop."""
    url = f"sqlite:///{tmp_path}/deaf.db"
    env = _env(url, EVENTLANES_TEST_BLOCK_SIGTERM="1")
    el.App(url).processor("hang")
    proc = _run(env, "tests.apps.hang:app", "--processes", "2", "--grace", "1")
    lines, seen = _stderr_lines(proc), []
    try:
        _read_until(lines, "ready:", seen, 60)
        proc.send_signal(signal.SIGTERM)
        _read_until(lines, "did not stop within 6 s: killed (their threads' stacks are above)",
                    seen, 30)  # fmt: skip
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    dump = "\n".join(seen)
    assert dump.count("Current thread 0x") == 2, dump  # one dump per worker
    assert "eventlanes/signals.py" in dump, dump  # where each main thread waits
    assert proc.returncode == 1


def test_a_second_signal_on_run_ends_it_at_once_and_says_so(tmp_path) -> None:
    """One process: SIGTERM is logged as the start of a clean stop; SIGINT meanwhile ends it
    at once (exit 130) with one error line."""
    proc, lines, seen = _hung(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        _read_until(lines, "SIGTERM again exits at once", seen, 10)
        proc.send_signal(signal.SIGINT)
        proc.wait(5)
        _read_until(lines, "error: SIGINT while stopping: exiting at once", seen, 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, seen


_SLOW_IMPORT = """
import importlib.abc, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "click":  # the command line's first heavy import
            sys.meta_path.remove(self)
            time.sleep(4)
        return None

sys.meta_path.insert(0, _Slow())
"""


@pytest.mark.parametrize(
    "command", [["-m", "eventlanes.cli"], ["-m", "eventlanes", "--log-level", "info"]]
)
def test_a_stop_while_the_command_line_loads_ends_quietly(
    tmp_path: Path, command: list[str]
) -> None:
    """Before: SIGINT while the command line was still being imported (about a second) ended
    `eventlanes run` with a KeyboardInterrupt traceback and exit -2. Its import of click is
    made to take 4 s here (a hook in sitecustomize); the signal comes in the middle of it.
    Now the entry's handling comes first: exit 0 and one line, as for a stop once loaded."""
    (tmp_path / "sitecustomize.py").write_text(_SLOW_IMPORT)
    env = _env(f"sqlite:///{tmp_path}/loading.db")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    proc = _run(env, "tests.apps.recorder:app", entry=tuple(command))
    time.sleep(2)  # the interpreter started, the import of click is asleep
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert proc.returncode == 0 and "stopped by SIGINT while starting" in err, (
        proc.returncode, err)  # fmt: skip


# A stop whose exception Python discards. Seen in real runs: the handler ran inside C code
# that cleared its exception (importing an extension module, compiling a module), and the run
# went on, deaf to the stop it had been sent, until it was killed. A finalizer discards what
# it raises just as surely, and deterministically: the signal is sent from one here.
_DISCARDED = """
import os, signal, threading
from eventlanes import signals

signals.interrupt_startup()

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here; Python prints what it raises, and drops it
            pass

Finalized()
print("start-up went on", flush=True)
started = []
stop = threading.Event()
timer = threading.Timer(10, stop.set)
timer.daemon = True
timer.start()
stopping = signals.run_until_signal(stop, start=lambda: started.append(True))
print(stopping.signal, "started" if started else "not started", flush=True)
"""


def test_a_stop_whose_exception_python_discarded_still_stops_the_run() -> None:
    """A SIGTERM while starting whose StartupInterrupted never reached the caller: the run
    still stops, before starting anything (before, it started and ran on until killed)."""
    proc = subprocess.run([sys.executable, "-c", _DISCARDED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert "StartupInterrupted" in proc.stderr, proc.stderr  # Python did discard it
    assert proc.stdout.splitlines() == ["start-up went on", "SIGTERM not started"], (
        proc.stdout, proc.stderr)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


_DISCARDED_THEN_AGAIN = """
import os, signal
from eventlanes import signals

signals.interrupt_startup()

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

Finalized()  # the first stop's exception discarded
try:
    os.kill(os.getpid(), signal.SIGTERM)  # a second one, while still starting
    for _ in range(1000):
        pass
    print("start-up went on")
except signals.StartupInterrupted as exc:
    print("stopped by", exc)
"""


def test_a_second_stop_after_a_discarded_one_still_interrupts_the_start_up() -> None:
    """The first stop's exception discarded, a second signal while still starting raises
    again (before, it was only recorded: a start-up that hung could not be stopped)."""
    proc = subprocess.run([sys.executable, "-c", _DISCARDED_THEN_AGAIN], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.stdout.splitlines() == ["stopped by SIGTERM"], (proc.stdout, proc.stderr)


def _gone(pid: int) -> bool:
    """Ended (a zombie nobody reaps counts: the tests' pid 1 may not reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_workers_whose_supervisor_was_killed_stop_and_release_their_claims(tmp_path) -> None:
    """The supervisor of `run --processes 2` killed (SIGKILL, as the OOM killer does): its
    workers stop as on SIGTERM, their claims released at once. Before, they ran on without
    it, holding their segments, until someone found them. Their exits hang here (60 s, in
    the app), and nobody is left to kill them: each ends by itself after its grace (3 s),
    its stacks in the log."""
    url = f"sqlite:///{tmp_path}/orphans.db"
    app = el.App(url, claim_timeout=1.5)
    app.processor("recorder", segments=4)
    create_schema(app)
    proc = _run(_env(url, EVENTLANES_TEST_APP_EXIT_SLEEP="60"), "tests.apps.recorder:app",
                "--processes", "2", "--grace", "3")  # fmt: skip
    lines, seen = _stderr_lines(proc), []
    try:
        _read_until(lines, "ready:", seen, 60)
        workers = worker_pids(proc.pid)
        assert len(workers) == 2, (workers, seen)
        proc.kill()
        proc.wait(10)
        wait_for(lambda: all(_gone(pid) for pid in workers), timeout=30,
                 what="the workers to stop without their supervisor")  # fmt: skip
        assert app.tokens.live_nodes("recorder") == [], "the workers left their claims"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        _read_until_end(lines, seen, 10)
    assert sum("the supervisor (pid" in line and "is gone: stopping" in line
               for line in seen) == 2, seen  # fmt: skip
    assert sum(line.startswith("Timeout (0:00:03)!") for line in seen) == 2, seen


def test_a_worker_signalled_once_its_run_is_over_still_exits_0(tmp_path) -> None:
    """A signal to a worker that has stopped but not yet exited (here its exit takes 3 s)
    changes nothing: exit 0. Before, the handlers were back at their defaults by then, and
    the supervisor's SIGTERM that follows a Ctrl-C to the whole group killed the worker that
    had already stopped on the Ctrl-C (a fresh clone saw "exit code -15")."""
    url = f"sqlite:///{tmp_path}/late.db"
    app = el.App(url, claim_timeout=1.5)
    app.processor("recorder", segments=2)
    create_schema(app)
    proc = _run(_env(url, EVENTLANES_TEST_APP_EXIT_SLEEP="3"), "tests.apps.recorder:app",
                "--processes", "2")  # fmt: skip
    lines, seen = _stderr_lines(proc), []
    try:
        _read_until(lines, "ready:", seen, 60)
        proc.send_signal(signal.SIGTERM)  # forwarded: the workers stop
        signalled = set()
        while len(signalled) < 2:  # each as it says its run is over, its process not yet
            line = lines.get(timeout=30)
            assert line is not None, seen
            seen.append(line)
            if line.startswith("exiting "):
                signalled.add(pid := int(line.split()[1]))
                os.kill(pid, signal.SIGTERM)
        _read_until(lines, "stopped cleanly: every worker is done", seen, 30)
        proc.wait(10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert sum("done, exit code 0;" in line for line in seen) == 2, seen
    assert proc.returncode == 0, seen


_SLOW_WORKER = """
import importlib.abc, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        # a worker's interpreter, before any of its code runs: the unpickling of its target
        if name == "eventlanes.cli.supervisor" and "--multiprocessing-fork" in sys.orig_argv:
            sys.meta_path.remove(self)
            sys.stderr.write("worker starting\\n")
            sys.stderr.flush()
            time.sleep(3)
        return None

sys.meta_path.insert(0, _Slow())
"""


def test_a_ctrl_c_while_a_worker_interpreter_starts_stops_it_quietly(tmp_path) -> None:
    """A Ctrl-C (SIGINT to the group) that reaches a worker before any of its code ran (its
    interpreter still starting): the worker ends as on one a moment later, exit 0, no
    traceback. Before, the signal found Python's defaults there: a KeyboardInterrupt
    traceback and exit 1 (SIGTERM: killed by it)."""
    (tmp_path / "sitecustomize.py").write_text(_SLOW_WORKER)
    url = f"sqlite:///{tmp_path}/early.db"
    app = el.App(url)
    app.processor("recorder")
    create_schema(app)
    env = _env(url)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    proc = _run(env, "tests.apps.recorder:app", "--processes", "2")
    lines, seen = _stderr_lines(proc), []
    try:
        _read_until(lines, "worker starting", seen, 60)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        _read_until_end(lines, seen, 10)
    log = "\n".join(seen)
    assert "Traceback" not in log, log
    assert log.count("done, exit code 0;") == 2, log
    assert proc.returncode == 0, log


# A second signal whose C-level handler runs on another thread than the main one (or on the
# main one just before a long wait starts): its Python handler waits for the main thread to
# run Python again. Sent here with pthread_kill to the thread of a hung handler, while the
# main thread waits for that handler's batch (grace 20 s).
_SECOND_ELSEWHERE = """
import os, signal, sys, threading, time
import eventlanes as el

app = el.App(sys.argv[1])
proc = app.processor("hang")
hung, never = threading.Event(), threading.Event()
where = []

@proc.on_any
def hang(event, ctx):
    where.append(threading.get_ident())
    hung.set()
    never.wait()

def stop_twice():
    hung.wait()
    os.kill(os.getpid(), signal.SIGTERM)  # the clean stop: it waits for the hung batch
    time.sleep(1.0)
    print("second", flush=True)
    signal.pthread_kill(where[0], signal.SIGINT)

threading.Thread(target=stop_twice, daemon=True).start()
app.store.append("s", [el.NewEvent("Step")])
app.run(grace=20)
"""


def test_a_second_signal_landing_on_another_thread_still_ends_the_run_at_once(
    tmp_path: Path,
) -> None:
    """Before, the main thread waited for the hung batch in one 20 s join, and the second
    signal acted only once it returned (a fresh clone saw `run` alive 5 s after its second
    signal). Now the waits are short and it ends at once, exit 130."""
    proc = subprocess.Popen([sys.executable, "-c", _SECOND_ELSEWHERE, f"sqlite:///{tmp_path}/s.db"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "second"
        sent = time.monotonic()
        proc.wait(30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 130, err
    assert "error: SIGINT while stopping: exiting at once" in err, err
    assert took < 5, f"ended {took:.1f} s after the second signal"
