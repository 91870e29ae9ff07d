"""Plays the autoscaler an operator runs beside eventlanes (KEDA or an HPA: see
docs/how-to/dashboard.md, "Scale on lag"), with real worker processes:
`eventlanes run APP --metrics-port P`.

It reads ``eventlanes_lag_events`` from a worker's metrics endpoint, as Prometheus would, and
takes the largest segment lag of the processor (``max(eventlanes_lag_events{processor=...})``:
every worker reports the same store-wide gauges, so a sum would count them once per worker).
The replicas it wants are ``ceil(lag / target)`` between ``min_workers`` and ``max_workers``
(the HPA's AverageValue rule; KEDA's Prometheus trigger does the same). It scales up at once
and down only once fewer workers were wanted for ``down_after`` seconds (the HPA's
stabilization window), stopping the newest workers with SIGTERM, as a Deployment's pods are
stopped, and measures how long each takes to exit.
"""

from __future__ import annotations

import math
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_lag(port: int, processor: str) -> float | None:
    """The processor's largest segment lag from one worker's /metrics (None: no answer yet,
    or the worker could not read the status)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    lags = []
    up = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "eventlanes_status_up":
                up = sample.value
            if (
                sample.name == "eventlanes_lag_events"
                and sample.labels.get("processor") == processor
            ):
                lags.append(sample.value)
    return max(lags) if up == 1.0 and lags else None


@dataclass
class Worker:
    proc: subprocess.Popen
    port: int
    started: float
    stopped: float | None = None  # seconds from SIGTERM to its exit
    code: int | None = None


@dataclass
class Autoscaler:
    spawn: Callable[[int], subprocess.Popen]  # metrics port -> a started worker process
    processor: str
    target: float  # lag per worker
    min_workers: int = 1
    max_workers: int = 4
    down_after: float = 3.0
    grace: float = 30.0
    workers: list[Worker] = field(default_factory=list)
    stopped: list[Worker] = field(default_factory=list)
    log: list[tuple[float, float | None, int]] = field(default_factory=list)  # t, lag, workers
    signalled: float = 0.0  # when the last scale-in sent its SIGTERMs (monotonic)
    _low_since: float | None = None

    def lag(self) -> float | None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                value = scrape_lag(worker.port, self.processor)
                if value is not None:
                    return value
        return None

    def desired(self, lag: float) -> int:
        return max(self.min_workers, min(self.max_workers, math.ceil(lag / self.target)))

    def step(self) -> float | None:
        """One reconciliation: read the lag, scale. Returns the lag read."""
        now = time.monotonic()  # when the lag was asked for: it counts what was appended by then
        lag = self.lag()
        self.log.append((now, lag, len(self.workers)))
        if lag is None:
            return None
        want = self.desired(lag)
        if want > len(self.workers):
            self._low_since = None
            self.scale_to(want)
        elif want < len(self.workers):
            self._low_since = self._low_since or now
            if now - self._low_since >= self.down_after:
                self._low_since = None
                self.scale_to(want)
        else:
            self._low_since = None
        return lag

    def scale_to(self, n: int) -> None:
        while len(self.workers) < n:
            port = free_port()
            self.workers.append(Worker(self.spawn(port), port, time.monotonic()))
        leaving = self.workers[n:]
        del self.workers[n:]
        sent = {}
        self.signalled = time.monotonic()
        for worker in leaving:  # the pods go at once, each gets SIGTERM
            sent[id(worker)] = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
        for worker in leaving:
            try:
                worker.code = worker.proc.wait(self.grace)
            except subprocess.TimeoutExpired:  # the orchestrator's SIGKILL after the grace
                worker.proc.kill()
                worker.code = worker.proc.wait()
            worker.stopped = time.monotonic() - sent[id(worker)]
            self.stopped.append(worker)
