"""What processing reports as it goes, for metrics and logs: a small observer interface.

The runners call these methods at fixed points; the default does nothing, so processing never
depends on a metrics library. ``eventlanes.admin.metrics`` implements it with prometheus-client.
Methods must be cheap and must not raise: they run on the processing threads.
"""

from __future__ import annotations

#: set on the log record of a runner's crash (the supervisor of ``run --processes N``
#: announces no ready line after one)
CRASH = "eventlanes_crash"


class Observer:
    """No-op base: subclass and override what you need."""

    def batch_handled(
        self, processor: str, segment: str, events: int, handler_seconds: float
    ) -> None:
        """A segment's batch of ``events`` ran its handlers in ``handler_seconds``."""

    def committed(self, processor: str, segment: str, seconds: float) -> None:
        """A segment's token (with the handlers' writes) was committed in ``seconds``."""

    def failed(self, processor: str, segment: str, error: str) -> None:
        """A batch failed (handler or database); the segment backs off and is retried."""

    def parked(self, processor: str, segment: str, events: int) -> None:
        """``events`` events were parked as dead letters."""

    def claims(self, processor: str, held: int) -> None:
        """This process now holds ``held`` segments of the processor."""

    def worker_restarted(self, worker: str) -> None:
        """The supervisor replaced a worker process that exited abnormally."""


NO_OBSERVER = Observer()
