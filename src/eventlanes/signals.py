"""Running until SIGINT or SIGTERM: the one loop shared by ``App.run``, the supervisor of
``run --processes N`` and the Spark runner."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def run_until_signal(
    stop: threading.Event,
    done: Callable[[], bool] | None = None,
    interval: float = 0.5,
    start: Callable[[], None] | None = None,
) -> None:
    """Block until a signal arrives, ``stop`` is set (from another thread), or ``done()`` says
    so; ``done`` is also where callers do their periodic work. Signal handlers are installed
    only on the main thread and restored afterwards. ``start()`` runs once they are installed
    (so a signal sent as soon as it says "ready" stops cleanly)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        if start is not None:
            start()
        while not stop.wait(interval):
            if done is not None and done():
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
