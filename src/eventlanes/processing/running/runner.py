"""Running one processor in this process: the parts wired together, started and stopped.

* :class:`~.coordinator.Coordinator`: which segments this process holds (claims, fair share,
  split / merge / release requests);
* :class:`~eventlanes.tokens.claims.Heartbeat`: extends the claims while handlers run,
  survives database errors;
* :class:`~.reader.BatchReader`: reads the next batch and shares it out among held segments;
* :class:`~.loops.PooledLoop` or :class:`~.loops.TrackingLoop`: the read-and-handle loop;
* the processor's executor (:func:`executor_for`, one per guarantee: :mod:`..executors`):
  runs handlers, commits tokens.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ...observe import CRASH
from ...signals import join
from ...store.notify import Wakeup, wakeup_for
from ...tokens.claims import Heartbeat, node_name
from ..aggregating.aggregation import Aggregation
from ..aggregating.executor import AggregationExecutor
from ..executors.base import Executor
from ..executors.exactly_once import TransactionalExecutor
from ..executors.lanes import LaneExecutor
from ..executors.republish import RepublishExecutor
from ..handling.failures import describe_crash
from ..options import Guarantee
from ..processor import Processor
from ..republisher import Republisher
from ..runtime import Runtime
from ..segment import SegmentState
from ..windowing.executor import WindowExecutor
from .coordinator import Coordinator
from .loops import PooledLoop, TrackingLoop
from .reader import BatchReader

log = logging.getLogger("eventlanes.processing")

__all__ = ["ProcessorRunner", "node_name", "unless_crashed"]


class Crashable(Protocol):
    """A runner whose ``error`` is set when it crashed (processors, Kafka ingestors)."""

    error: BaseException | None


#: held while a crash is recorded and while "ready" is announced, so that no ready line ever
#: follows a crash line (see :func:`unless_crashed`)
_CRASHES = threading.Lock()


def unless_crashed(runners: Sequence[Crashable], then: Callable[[], None]) -> bool:
    """Call ``then`` (e.g. log a ready line) unless one of ``runners`` has crashed, atomically
    with the crashes: a crash is either before it (and ``then`` is not called) or after."""
    with _CRASHES:
        if any(r.error is not None for r in runners):
            return False
        then()
        return True


class ProcessorRunner:
    """One processor, in this process. ``start()`` returns at once; ``stop()`` finishes the
    batch in hand, stores tokens and releases the claims."""

    def __init__(
        self,
        runtime: Runtime,
        processor: Processor,
        owner: str | None = None,
        static: tuple[int, int] | None = None,
        wakeup: Wakeup | None = None,
    ) -> None:
        self.runtime = runtime
        self.processor = processor
        self.name = processor.name
        self.owner = owner or node_name()
        self.wakeup = wakeup or wakeup_for(runtime.store, runtime.poll_interval)
        self._own_wakeup = wakeup is None
        self.executor = executor = executor_for(runtime, processor, self.owner)
        interval = runtime.tokens.claim_timeout / 3
        self.coordinator = Coordinator(
            processor,
            self.owner,
            tokens=runtime.tokens,
            dead_letters=runtime.dead_letters,
            observer=runtime.observer,
            progress=runtime.progress,
            read_waits=runtime.read_waits,
            persist=executor.persist,
            record_crash=executor.crashed,
            static=static,
            interval=min(1.0, interval),
        )
        sources = [("", runtime.store)] + [
            (name, runtime.source_store(target)) for name, target in processor.sources.items()
        ]
        clock = getattr(executor, "clock", None)  # a windowed aggregation's store clock
        self.reader = BatchReader(processor, sources, clock.at if clock is not None else None)
        self.heartbeat = Heartbeat(
            runtime.tokens, self.name, self.owner, interval, on_held=self.coordinator.held
        )
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def claimed(self) -> dict[int, SegmentState]:
        return self.coordinator.claimed

    def behind(self, head: int) -> bool:
        """Whether a segment held here (not lost) is still short of ``head``: then it is not
        caught up, whatever its stored token says (that one is at most the one in memory)."""
        return any(st.token.position < head and not st.lost for st in list(self.claimed.values()))

    def start(self) -> None:
        self.runtime.initialize(*self.processor.token_spec())
        self.runtime.tokens.heartbeat(self.name, self.owner)
        if self.processor.mode == "pooled":
            threads = self.processor.handler_threads
            loop: PooledLoop | TrackingLoop = PooledLoop(
                self.coordinator, self.reader, self.executor, self.wakeup, self.stopping, threads
            )
        else:
            loop = TrackingLoop(
                self.coordinator, self.reader, self.executor, self.wakeup, self.stopping, self.guard
            )
        self._thread = threading.Thread(
            target=self.guard(loop.run), name=f"eventlanes-{self.name}-main", daemon=True
        )
        self._thread.start()
        self.heartbeat.start()

    def guard(self, target: Callable[[], None]) -> Callable[[], None]:
        """``target`` in a thread whose crash stops the runner (and is raised by ``stop``)."""

        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop() and status
                with _CRASHES:
                    if self.error is None:
                        self.error = exc
                    self.stopping.set()
                    log.error("%s: crashed, stopping: %s", self.name, describe_crash(exc),
                              exc_info=exc, extra={CRASH: True})  # fmt: skip

        return run

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop; False when the processing thread did not end within ``timeout`` (a handler
        still runs): its claims are then left to expire rather than extended forever."""
        self.stopping.set()
        self.wakeup.notify()
        if self._thread is not None:
            join(self._thread, timeout)  # in slices: a second signal acts at once
        clean = self._thread is None or not self._thread.is_alive()
        self.heartbeat.stop()
        if clean:  # left again: a beat after the thread left wrote its node row back
            try:
                self.runtime.tokens.leave(self.name, self.owner)
            except Exception as exc:  # noqa: BLE001 - the row ages out by itself
                log.warning("%s: could not leave on shutdown (%s)", self.name, exc)
        if self._own_wakeup:
            self.wakeup.close()
        return clean


def executor_for(runtime: Runtime, proc: Processor, owner: str) -> Executor:
    """The executor of ``proc``'s guarantee."""
    if isinstance(proc, Aggregation) and proc.windowing is not None:
        return WindowExecutor(runtime, proc, owner)
    if isinstance(proc, Aggregation):
        return AggregationExecutor(runtime, proc, owner)
    if isinstance(proc, Republisher):
        return RepublishExecutor(runtime, proc, owner)
    if proc.guarantee is Guarantee.AT_LEAST_ONCE:
        return LaneExecutor(runtime, proc, owner)
    return TransactionalExecutor(runtime, proc, owner)
