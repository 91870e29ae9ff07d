"""``eventlanes run --processes N``: N worker processes sharing the work through the token store.

Python threads only help I/O-bound handlers (the GIL); CPU parallelism comes from processes.
Each worker imports the app and runs it. A worker that dies (a crash, SIGKILL, the OOM killer,
the database unavailable while it starts) loses its claims when they time out, the others
continue from the stored tokens, and the supervisor starts a replacement after a back-off (1 s
doubling to 30 s), at most ``max_restarts`` times in all. A worker that stops on a user error
(exit code 2: a bad module, an unknown processor) is not restarted: the same error would come
back (the supervisor says so when it happens). SIGINT/SIGTERM are forwarded so every worker
finishes its batch, stores its tokens and releases its claims; the supervisor logs each worker
that is done, and a second signal kills them at once (exit ``128 + signum``). The workers
leave that second signal to it: a Ctrl-C reaches the whole process group, so a worker sees it
and the supervisor's SIGTERM.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from typing import Any

from .. import signals
from ..observe import NO_OBSERVER, Observer
from ..signals import Stopping, run_until_signal
from .logs import WorkerLogs

log = logging.getLogger("eventlanes.cli.supervisor")

USER_ERROR = 2  # exit code of a worker stopped by an eventlanes error (see _worker)


#: asks a worker for its threads' stacks (faulthandler, on its stderr)
STACKS = signal.SIGUSR1


def _dump_stacks(children: list[BaseProcess]) -> None:
    """Ask ``children`` for their threads' stacks and give them a moment to write them."""
    for child in children:
        if child.pid is not None:
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(child.pid, STACKS)
    time.sleep(0.5)


def _worker(
    spec: str,
    processors: list[str] | None,
    grace: float,
    logs: Any,
    level: str,
    balance: bool,
    kafka: dict[str, str],
) -> None:
    from ..kafka.settings import use_overrides

    use_overrides(kafka)  # run --kafka: from the start arguments, never the environment
    # Once its run is over, a signal changes nothing (the supervisor's SIGTERM that follows a
    # Ctrl-C to the group may come after the worker stopped on the Ctrl-C): it ends as it
    # would, exit 0, its last log records and spans sent, instead of dying by the signal.
    # A handler that does nothing (SIG_IGN now would discard a signal pending since the
    # spawn), then ignored for the exit (Python puts its handlers back to the default then).
    for sig in signals.SIGNALS:
        signal.signal(sig, _over)
    # stopped while it starts: exit 0 at once (not by the signal); a second signal while it
    # stops is the supervisor's to act on (see the module's docstring)
    signals.interrupt_startup()
    signals.leave_second_signal_to_parent()
    _stop_with_parent()  # its thread keeps the signals blocked: they are the main thread's
    # A worker the supervisor is about to kill (still running past its grace) is first asked
    # for every thread's stack, on its stderr: why it did not stop is then in the log.
    faulthandler.register(STACKS, all_threads=True, chain=False)
    try:
        # the signals the supervisor blocked around the spawn (Supervisor._start), pending
        # since if one came while Python started: delivered now, to interrupt_startup's
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.SIGNALS)
        _work(spec, processors, grace, logs, level, balance)
    except signals.StartupInterrupted:
        sys.exit(0)
    finally:
        for sig in signals.SIGNALS:
            # setting a handler runs those pending first: a stop during a failed start-up
            with contextlib.suppress(signals.StartupInterrupted):
                signal.signal(sig, signal.SIG_IGN)
        # Deaf to SIGTERM now: an exit that hangs (a thread joined, an atexit hook) ends by
        # itself, its stacks in the log, also with no supervisor left to kill it.
        faulthandler.dump_traceback_later(max(grace, 1.0), exit=True)


def _over(signum: int, frame: Any) -> None:
    """A worker's handler once its run is over (see _worker)."""


def _stop_with_parent() -> None:
    """A worker whose supervisor died (SIGKILL, the OOM killer) stops as on SIGTERM: it
    finishes its batch, stores its tokens and releases its claims, instead of running on
    unsupervised, holding them, until someone finds it."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the supervisor's end of the sentinel pipe closes
        from .logs import supervisor_gone

        supervisor_gone()
        log.warning("the supervisor (pid %s) is gone: stopping", parent.pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="eventlanes-parent-watch", daemon=True).start()


def _work(
    spec: str, processors: list[str] | None, grace: float, logs: Any, level: str, balance: bool
) -> None:
    from ..errors import (
        DatabaseUnavailableError,
        EventlanesError,
        ProcessorCrashedError,
        StopTimeoutError,
    )
    from ..loader import load_app
    from ..tracing import configure_from_env
    from ..tracing import shutdown as shutdown_tracing
    from .logs import setup_worker, tell_ready

    sender = None if logs is None else setup_worker(logs, level)  # to the supervisor's handlers
    observer = None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # the supervisor serves the sum
        from ..admin.metrics import PrometheusObserver

        observer = PrometheusObserver(registry=None)
    ready = None if sender is None else (lambda: tell_ready(sender))
    try:
        app = load_app(spec)
        configure_from_env()  # each worker exports its own spans (OTEL_* are inherited)
        try:
            app.run(processors, grace=grace, observer=observer, balance=balance, on_ready=ready)
        finally:
            shutdown_tracing()
    except ProcessorCrashedError as exc:
        # An abnormal exit (the crash is recorded in status): replaced like any dead worker. A
        # normal exit, so the log records still queued reach the supervisor.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except StopTimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(1)  # a hung handler's thread would block a normal exit
    except DatabaseUnavailableError as exc:
        # An outage while it started (a running worker weathers one): not a user error, which
        # would leave it stopped for good while the others run on; replaced after a back-off.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except EventlanesError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR)


class Supervisor:
    def __init__(
        self,
        spec: str,
        processes: int,
        processors: list[str] | None = None,
        max_restarts: int = 0,
        observer: Observer | None = None,
        grace: float = 30.0,
        log_level: str | None = None,
        balance: bool = False,
        on_ready: Callable[[], Any] | None = None,
    ) -> None:
        """``on_ready()``: called once every worker's processors run, unless a worker logged a
        crash before (needs ``log_level``: workers tell it in line with their log records)."""
        if processes < 1:
            raise ValueError("--processes must be >= 1")
        if max_restarts < 0:
            raise ValueError("--max-restarts must be >= 0")
        self.spec = spec
        self.processors = processors
        self.max_restarts = max_restarts
        self.restarts = 0
        if observer is None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from ..admin.metrics import PrometheusObserver

            observer = PrometheusObserver(registry=None)  # counts restarts in the shared files
        self.observer = observer or NO_OBSERVER
        self.grace = grace
        self.ctx = mp.get_context("spawn")
        self.logs = None if log_level is None else WorkerLogs(self.ctx, processes, on_ready)
        from ..kafka.settings import overrides

        # run --kafka options (secrets among them) travel in the start arguments: spawn pickles
        # them down a pipe to the child, where the environment would show them to every
        # process started below it and in /proc/PID/environ
        self._args = (spec, processors, grace)
        self._more_args = (log_level or "info", balance, overrides())
        self._channels: dict[int, Any] = {}  # slot -> the log pipe's end its worker gets
        self.children: list[BaseProcess] = [self._spawn(i) for i in range(processes)]
        self._due: dict[int, float] = {}  # slot -> when its replacement may start
        self._stopped: set[int] = set()  # slots whose worker stopped on a user error
        self._failed_code: int | None = None
        self._stop = threading.Event()

    def _spawn(self, slot: int) -> BaseProcess:
        channel = None if self.logs is None else self.logs.channel()
        self._channels[slot] = channel
        args = (*self._args, channel, *self._more_args)
        return self.ctx.Process(target=_worker, args=args, name=f"eventlanes-worker-{slot}")

    def _start(self, slot: int) -> None:
        # SIGINT/SIGTERM blocked in the new process until its handlers are in place: one sent
        # while its interpreter starts waits for them (see _worker), instead of killing it
        # half-started or reaching code that cannot act on it. The stdlib does the same for
        # its resource tracker, then unblocks them: started first, it would undo our block.
        # (A tracker that dies in between is started again by the spawn, unblocking them for
        # that one worker: it then only loses this protection.)
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals.SIGNALS)
        try:
            self.children[slot].start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        channel = self._channels.pop(slot)
        if channel is not None:
            channel.close()  # the worker holds its own copy: the pipe ends when it does

    def start(self) -> None:
        for slot in range(len(self.children)):
            self._start(slot)

    def stop(self) -> None:
        self._stop.set()

    def terminate(self, grace: float = 30.0, stopping: Stopping | None = None) -> None:
        """SIGTERM to every worker, then wait for them (logging each that is done) up to
        ``grace`` seconds, or until ``stopping.again`` (a second signal): then SIGKILL."""
        alive = [c for c in self.children if c.pid is not None and c.is_alive()]
        for child in alive:
            child.terminate()  # SIGTERM: a clean shutdown in the worker
        if alive and stopping is not None:
            log.info("stopping %d worker(s): each finishes its batch in hand (up to %.0f s; "
                     "%s again stops them at once)", len(alive), grace,
                     stopping.signal or "a signal")  # fmt: skip
        deadline = time.monotonic() + grace
        pending = [c for c in self.children if c.pid is not None]
        while pending:
            for child in [c for c in pending if not c.is_alive()]:
                child.join()
                pending.remove(child)
                if stopping is not None:
                    log.info("worker %s (pid %s) done, exit code %s; %d still stopping",
                             child.name, child.pid, child.exitcode, len(pending))  # fmt: skip
            if not pending:
                break
            if stopping is not None and stopping.again is not None:
                name = signal.Signals(stopping.again).name
                self._kill(pending, f"error: {name} while stopping: {len(pending)} worker(s) "
                           "killed at once (their claims expire)")  # fmt: skip
                self._failed_code = 128 + stopping.again  # as a shell reports it
                return
            if time.monotonic() >= deadline:
                _dump_stacks(pending)
                self._kill(pending, f"error: worker(s) {', '.join(c.name for c in pending)} "
                           f"did not stop within {grace:.0f} s: killed (their threads' "
                           "stacks are above)")  # fmt: skip
                self._failed_code = self._failed_code or 1
                return
            time.sleep(0.05)  # a signal handler only sets a flag: looked at here

    @staticmethod
    def _kill(children: list[BaseProcess], message: str) -> None:
        for child in children:
            child.kill()
        for child in children:
            child.join()
        print(message, file=sys.stderr, flush=True)

    def _watch(self) -> bool:
        """Replace workers that died; True when nothing is left to supervise."""
        now = time.monotonic()
        for slot, child in enumerate(self.children):
            if child.pid is None or child.is_alive():
                continue
            code = child.exitcode
            if code in (0, -signal.SIGTERM):
                continue  # asked to stop (or done): not a failure
            if code == USER_ERROR:
                if slot not in self._stopped:  # said once, when it happens
                    self._stopped.add(slot)
                    log.error("worker %s (pid %s) stopped on an error (exit code 2, its error: "
                              "line above): not restarted, the same error would come back",
                              child.name, child.pid)  # fmt: skip
                self._failed_code = USER_ERROR
                continue
            if slot not in self._due:
                if self.restarts >= self.max_restarts:
                    if self._failed_code is None:
                        log.error("worker %s exited with code %s; no restarts left (%d used)",
                                  child.name, code, self.restarts)  # fmt: skip
                    self._failed_code = 1
                    continue
                delay = min(30.0, 2.0**self.restarts)
                self._due[slot] = now + delay
                log.warning("worker %s (pid %s) exited with code %s; restarting in %.0f s (%d/%d)",
                            child.name, child.pid, code, delay, self.restarts + 1,
                            self.max_restarts)  # fmt: skip
                self.restarts += 1
            if now >= self._due[slot]:
                del self._due[slot]
                replacement = self.children[slot] = self._spawn(slot)
                self._start(slot)
                self.observer.worker_restarted(replacement.name)
                log.warning("worker %s restarted (pid %s)", replacement.name, replacement.pid)
        return not self._due and not any(c.is_alive() for c in self.children)

    def run(self, tick: Callable[[], Any] | None = None, interval: float = 0.5) -> int:
        """Start, then supervise until a signal, ``stop()``, or every worker ended; returns an
        exit code: 0, 2 when a worker stopped on a user error, 1 when one died for good."""

        def step() -> bool:
            if tick is not None:
                try:
                    tick()
                except Exception as exc:  # noqa: BLE001 - a status poll must not stop the work
                    log.warning("status poll failed: %s", exc)
            return self._watch()

        def shut_down(stopping: Stopping) -> None:
            try:
                self.terminate(self.grace + 5, stopping)  # the workers' own grace, then SIGKILL
            finally:
                if self.logs is not None:
                    self.logs.close()

        # signals are taken before the workers start: one during the spawn stops them all
        stopping = run_until_signal(
            self._stop, step, interval, start=self.start, then=shut_down, second_exits=False
        )
        if stopping.signal is not None and self._failed_code is None:
            log.info("stopped cleanly: every worker is done")
        return self._failed_code or 0
