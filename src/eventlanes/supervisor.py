"""``eventlanes run --processes N``: N worker processes sharing the work through the token store.

Python threads only help I/O-bound handlers (the GIL); CPU parallelism comes from processes.
Each worker imports the app and runs it; a worker that dies (even by SIGKILL) loses its claims
when they time out and the others continue from the stored tokens. The supervisor forwards
SIGINT/SIGTERM so every worker finishes its batch, stores its tokens and releases its claims.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .logs import WorkerLogs


def _worker(spec: str, processors: list[str] | None, logs: Any = None, level: str = "info") -> None:
    from .loader import load_app

    if logs is not None:  # observe: records go to the supervisor's handlers
        from .logs import setup_worker

        setup_worker(logs, level)
    observer = None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # observe: the supervisor serves the sum
        from .metrics import PrometheusObserver

        observer = PrometheusObserver(registry=None)
    load_app(spec).run(processors, observer=observer)


class Supervisor:
    def __init__(
        self,
        spec: str,
        processes: int,
        processors: list[str] | None = None,
        log_level: str | None = None,  # observe
    ) -> None:
        if processes < 1:
            raise ValueError("--processes must be >= 1")
        self.spec = spec
        self.processors = processors
        self.ctx = mp.get_context("spawn")
        self.logs = None if log_level is None else WorkerLogs(self.ctx)  # observe
        args = (spec, processors, self.logs and self.logs.queue, log_level or "info")  # observe
        self.children = [
            self.ctx.Process(target=_worker, args=args, name=f"eventlanes-worker-{i}")
            for i in range(processes)
        ]
        self._stop = threading.Event()

    def start(self) -> None:
        for child in self.children:
            child.start()

    def stop(self) -> None:
        self._stop.set()

    def terminate(self, grace: float = 30.0) -> None:
        for child in self.children:
            if child.is_alive() and child.pid is not None:
                child.terminate()  # SIGTERM: a clean shutdown in the worker
        deadline = time.monotonic() + grace
        for child in self.children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()

    def run(self, tick: Callable[[], Any] | None = None, interval: float = 0.5) -> int:
        """Start, then wait for a signal or for every worker to end; returns an exit code."""
        self.start()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            while not self._stop.wait(interval):
                if tick is not None:
                    tick()
                if not any(c.is_alive() for c in self.children):
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.terminate()
            if self.logs is not None:  # observe
                self.logs.close()  # observe
        # A worker that died (crash, SIGKILL) makes the run fail, even though the others
        # carried on with its segments.
        return 0 if all(c.exitcode in (0, -signal.SIGTERM) for c in self.children) else 1
