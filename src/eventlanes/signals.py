"""Running until SIGINT or SIGTERM: the one loop shared by ``App.run``, the supervisor of
``run --processes N`` and the Spark runner; and what those signals do before it runs.

A process is told to stop whenever its orchestrator likes, also while it starts (an
autoscaler that scales in right after scaling out): :func:`interrupt_startup` makes SIGINT
and SIGTERM raise :class:`StartupInterrupted` until :func:`run_until_signal` takes over, so
importing the app or opening the store ends at once, through every ``finally``, with exit
code 0 (instead of the process dying by the signal, with whatever it had started).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_before: dict[int, Any] = {}  # the handlers interrupt_startup replaced


class StartupInterrupted(BaseException):
    """SIGINT or SIGTERM arrived before the processors ran (a BaseException, like
    KeyboardInterrupt: no ``except Exception`` on the way swallows it)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise StartupInterrupted(signal.Signals(signum).name)


def interrupt_startup() -> None:
    """From now until :func:`run_until_signal` installs its handlers, SIGINT and SIGTERM
    raise :class:`StartupInterrupted` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        previous = signal.signal(sig, _interrupt)
        if previous is not _interrupt:
            _before[sig] = previous


def run_until_signal(
    stop: threading.Event,
    done: Callable[[], bool] | None = None,
    interval: float = 0.5,
    start: Callable[[], None] | None = None,
) -> None:
    """Block until a signal arrives, ``stop`` is set (from another thread), or ``done()`` says
    so; ``done`` is also where callers do their periodic work. Signal handlers are installed
    only on the main thread and restored afterwards (those from before
    :func:`interrupt_startup`: a second signal during the shutdown acts as it did before).
    ``start()`` runs once they are installed (so a signal sent as soon as it says "ready"
    stops cleanly)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            replaced = signal.signal(sig, lambda *_: stop.set())
            previous[sig] = _before.pop(sig, signal.SIG_DFL) if replaced is _interrupt else replaced
    try:
        if start is not None:
            start()
        while not stop.wait(interval):
            if done is not None and done():
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
