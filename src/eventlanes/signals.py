"""Running until SIGINT or SIGTERM: the one loop shared by ``App.run``, the supervisor of
``run --processes N`` and the Spark runner; and what those signals do before it runs.

A process is told to stop whenever its orchestrator likes, also while it starts (an
autoscaler that scales in right after scaling out): :func:`interrupt_startup` makes SIGINT
and SIGTERM raise :class:`StartupInterrupted` until :func:`run_until_signal` takes over, so
importing the app or opening the store ends at once, through every ``finally``, with exit
code 0 (instead of the process dying by the signal, with whatever it had started).

That exception can be lost. CPython runs a Python handler wherever the main thread next
looks for signals, and some of those places discard what the handler raised: a finalizer
(``__del__``, a weakref callback), and C code that clears errors (seen while importing an
extension module and while compiling a module: the exception was freed without a single
frame in its traceback). So the handler also records the signal, and whatever comes next
(:func:`run_until_signal`, :func:`stopped_while_starting`) acts on the record: a lost
exception delays the stop to the end of start-up, it never cancels it.

No handler here takes a lock. A Python handler runs in the main thread between two bytecodes,
also while that thread holds a lock (inside ``Event.wait``, a logging handler, a buffered
write): a handler that took the same lock (``event.set()``, ``log.info``, ``print``) would
wait for itself forever. The handlers store plain values and write a byte to a pipe (the
self-pipe the main thread sleeps on in ``select``); everything else happens in the main loop.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_before: dict[int, Any] = {}  # the handlers interrupt_startup replaced
_SLICE = 0.05  # how long the loop sleeps before looking at ``stop`` (set by other threads)
_settings = {"second_exits": True}  # see leave_second_signal_to_parent

log = logging.getLogger("eventlanes.signals")


class StartupInterrupted(BaseException):
    """SIGINT or SIGTERM arrived before the processors ran (a BaseException, like
    KeyboardInterrupt: no ``except Exception`` on the way swallows it). Whoever catches it
    and carries on, instead of ending the process, calls :func:`startup_done`."""


class Stopping:
    """The signals one :func:`run_until_signal` received, as its handlers record them (plain
    stores, no lock): ``signal`` names the first (None: stopped otherwise), ``again`` is the
    number of one that came while stopping (None: none did)."""

    def __init__(self, second_exits: bool) -> None:
        self.signal: str | None = None
        self.again: int | None = None
        self.stopping = False
        self.second_exits = second_exits
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            self.again = signum
            if self.second_exits:
                exit_at_once(signum)
        elif self.signal is None:
            self.signal = name
        try:
            os.write(self._write, b"\0")  # wakes the loop's select at once
        except OSError:
            pass  # the pipe is full: the loop is awake already

    def sleep(self, seconds: float) -> None:
        """Sleep until a signal arrives or ``seconds`` pass."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, seconds))
        if ready:
            try:
                os.read(self._read, 4096)
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def exit_at_once(signum: int) -> None:
    """A signal while stopping: say so in one line and end now, ``128 + signum`` as a shell
    reports a process ended by it. Only system calls (no lock): it runs in a handler."""
    name = signal.Signals(signum).name
    os.write(2, f"error: {name} while stopping: exiting at once without finishing the work in "
                "hand (its claims expire and another node continues)\n".encode())  # fmt: skip
    os._exit(128 + signum)


def leave_second_signal_to_parent() -> None:
    """In a worker process: a signal while stopping is not an order to exit at once (the
    supervisor forwards SIGTERM after a Ctrl-C reached the whole process group); the
    supervisor decides, and kills the workers when it gets a second one."""
    _settings["second_exits"] = False


_taking_over: list[Stopping] = []  # the run installing its handlers (see _interrupt)


_arrived: list[str] = []  # every signal _interrupt received (list.append: no lock)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _taking_over:  # run_until_signal is replacing this handler: a stop, not an exception
        _taking_over[0].handle(signum, frame)
        return
    name = signal.Signals(signum).name
    _arrived.append(name)  # kept for when Python discards the exception (module docstring)
    # Not while one is being handled: a second would cut short the ``except`` or ``finally``
    # handling the first. Otherwise again, also when the first was discarded.
    if not isinstance(sys.exception(), StartupInterrupted):
        raise StartupInterrupted(name)


def interrupt_startup() -> None:
    """From now until :func:`run_until_signal` installs its handlers, SIGINT and SIGTERM
    raise :class:`StartupInterrupted` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        previous = signal.signal(sig, _interrupt)
        if previous is not _interrupt:  # a new start-up (not a second call during one)
            _before[sig] = previous
            _arrived.clear()


def stopped_while_starting() -> str | None:
    """The first signal that came during this start-up (None: none came). Asked where its
    :class:`StartupInterrupted` would have arrived: a name here means Python discarded it."""
    return _arrived[0] if _arrived else None


def startup_done() -> None:
    """Undo :func:`interrupt_startup`: the handlers from before it are back (in the main
    thread; elsewhere nothing was installed)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) is _interrupt:
            signal.signal(sig, _before.pop(sig, signal.SIG_DFL))
    _arrived.clear()  # this start-up is over: ask stopped_while_starting() before


def run_until_signal(
    stop: threading.Event,
    done: Callable[[], bool] | None = None,
    interval: float = 0.5,
    start: Callable[[], None] | None = None,
    then: Callable[[Stopping], None] | None = None,
    second_exits: bool | None = None,
) -> Stopping:
    """Block until a signal arrives, ``stop`` is set (from another thread), or ``done()`` says
    so; ``done`` is also where callers do their periodic work. Signal handlers are installed
    only on the main thread. ``start()`` runs once they are installed (so a signal sent as
    soon as it says "ready" stops cleanly); ``then(stopping)`` runs at the end, also after an
    exception: the shutdown, during which another signal exits at once (or, in a worker
    process, is only recorded as ``stopping.again``). After it, the handlers from before
    :func:`interrupt_startup` are back. ``second_exits=False``: ``then`` looks at
    ``stopping.again`` itself (the supervisor, which kills its workers). A signal that came
    during start-up and whose exception Python discarded stops it before ``start()``."""
    stopping = Stopping(_settings["second_exits"] if second_exits is None else second_exits)
    previous: dict[int, Any] = {}
    main = threading.current_thread() is threading.main_thread()
    try:
        if main:
            _taking_over.append(stopping)
            try:
                for sig in SIGNALS:
                    replaced = signal.signal(sig, stopping.handle)
                    if replaced is _interrupt:
                        previous[sig] = _before.pop(sig, signal.SIG_DFL)
                        if _arrived:  # a stop its exception did not carry (module docstring)
                            stopping.signal = _arrived[0]
                    else:
                        previous[sig] = replaced
            finally:
                _taking_over.clear()
                _arrived.clear()
        if start is not None and stopping.signal is None:
            start()
        _loop(stopping, stop, done, interval)
        if stopping.signal is not None:
            log.info("%s received: stopping cleanly", stopping.signal)
    finally:
        stopping.stopping = True
        try:
            if then is not None:
                then(stopping)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            stopping.close()
    return stopping


def join(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)`` in short waits. A signal whose C-level handler ran just before
    a long wait began (or on another thread) leaves its Python handler pending until the
    main thread runs Python again: one 20 s join held a second Ctrl-C back for 20 s. Between
    two short waits the handler runs."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive():
        left = _SLICE * 2 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return
        thread.join(min(left, _SLICE * 2))


def _loop(
    stopping: Stopping, stop: threading.Event, done: Callable[[], bool] | None, interval: float
) -> None:
    due = time.monotonic() + interval
    while stopping.signal is None and not stop.is_set():
        now = time.monotonic()
        if now >= due:
            if done is not None and done():
                return
            due = now + interval
        stopping.sleep(min(_SLICE, due - now))
