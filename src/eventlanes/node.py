"""This process as a node of an App: the threads that run its processors (a runner each, and a
balancer where asked) and its Kafka ingestors, and the wakeup they share; started and stopped
together by ``app.start`` and ``app.stop``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .errors import InvalidInputError, ProcessorCrashedError, StopTimeoutError
from .kafka.ingest import IngestRunner
from .kafka.ingestor import Ingestor
from .processing.handling.failures import describe_crash
from .processing.processor import Processor
from .processing.running.balance import Balancer
from .processing.running.runner import ProcessorRunner, unless_crashed
from .processing.runtime import Runtime
from .store.notify import Wakeup, wakeup_for
from .tokens.claims import node_name

#: where metrics listen unless told: every interface, so Prometheus scrapes a pod by its IP
#: (the deployment guide's manifests rely on it); ``127.0.0.1`` keeps them to this host.
DEFAULT_METRICS_HOST = "0.0.0.0"


def serve_metrics(serve: Callable[[int, str], Any], port: int, host: str) -> Any:
    """``serve(port, host)`` (a ``MetricsServer``: admin is a layer above), with an address
    that cannot be used (a port in use, a host that is not this machine's) one clear error."""
    if not isinstance(host, str) or not host.strip():
        raise InvalidInputError(f"the metrics host must be an address like 127.0.0.1, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidInputError(f"the metrics port must be 0..65535, got {port!r}")
    try:
        return serve(port, host)
    except OSError as exc:
        raise InvalidInputError(
            f"metrics cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


def static_mode(node_index: int | None, nodes: int | None) -> tuple[int, int] | None:
    """``(node_index, nodes)`` of static mode (segments dealt out by index, nothing claimed);
    None when neither is given."""
    if node_index is None and nodes is None:
        return None
    if node_index is None or nodes is None:
        raise InvalidInputError("static mode needs both node_index and nodes")
    return (node_index, nodes)


class Node:
    """The runners of one start, until the stop that ends them."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.runners: list[ProcessorRunner] = []
        self.ingest_runners: list[IngestRunner] = []
        self.balancers: list[Balancer] = []
        self.wakeup: Wakeup | None = None

    @property
    def running(self) -> bool:
        return bool(self.runners or self.ingest_runners)

    def stopping(self) -> bool:
        """Whether a runner is stopping by itself (it crashed): the others should stop too."""
        every: list[ProcessorRunner | IngestRunner] = [*self.runners, *self.ingest_runners]
        return any(r.stopping.is_set() for r in every)

    def start(
        self,
        procs: list[Processor],
        ingestors: list[Ingestor],
        static: tuple[int, int] | None,
        balance: bool,
        on_ready: Callable[[], None] | None,
    ) -> None:
        """Start a runner per processor and ingestor (ingestors first, once every broker
        answers), and a balancer per processor if ``balance`` (not in static mode)."""
        self.wakeup = wakeup_for(self.runtime.store, self.runtime.poll_interval)
        owner = node_name()
        ingest = [IngestRunner(self.runtime, ingestor, owner) for ingestor in ingestors]
        for runner in ingest:
            runner.check()  # the broker answers, within its timeout: before anything starts
        for runner in ingest:
            runner.start()
            self.ingest_runners.append(runner)
        for proc in procs:
            processing = ProcessorRunner(self.runtime, proc, owner, static, self.wakeup)
            processing.start()
            self.runners.append(processing)
            if balance and static is None:
                balancer = Balancer(self.runtime, proc, owner)
                balancer.start()
                self.balancers.append(balancer)
        if on_ready is not None:
            unless_crashed([*self.runners, *self.ingest_runners], on_ready)

    def check(self, ingestors: list[Ingestor]) -> None:
        """Raise (one clear error) unless every ingestor's broker answers with its topic."""
        for ingestor in ingestors:
            IngestRunner(self.runtime, ingestor, node_name()).check()

    def stop(self, timeout: float, before_raising: Callable[[], Any]) -> None:
        """Finish the batches in hand, store tokens, release claims, within ``timeout``
        seconds in all; then ``before_raising()``, then raise for a runner that crashed
        (:class:`ProcessorCrashedError`) or did not stop (:class:`StopTimeoutError`)."""
        ingest, self.ingest_runners = self.ingest_runners, []
        for ing in ingest:
            ing.stopping.set()
        for balancer in self.balancers:
            balancer.stop()
        self.balancers = []
        runners, self.runners = self.runners, []
        for runner in runners:
            runner.stopping.set()
        deadline = time.monotonic() + timeout
        stuck = [r.name for r in runners if not r.stop(max(0.0, deadline - time.monotonic()))]
        stuck += [r.name for r in ingest if not r.stop(max(0.0, deadline - time.monotonic()))]
        if self.wakeup is not None:
            self.wakeup.close()
            self.wakeup = None
        before_raising()
        ended: list[ProcessorRunner | IngestRunner] = [*runners, *ingest]
        crashed = [r for r in ended if r.error is not None]
        if crashed:
            error = crashed[0].error
            assert error is not None
            raise ProcessorCrashedError(crashed[0].name, describe_crash(error)) from error
        if stuck:
            raise StopTimeoutError(
                f"processor(s) {', '.join(stuck)} did not stop within {timeout:g} s (a handler "
                "still runs); their claims expire and another node continues"
            )
