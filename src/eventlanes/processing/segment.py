"""What this process knows about one segment it holds, and how that changes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..events import Event
from ..segments import Segment
from ..tokens import Token


class Outcome(Enum):
    OK = "ok"
    LOST = "lost"  # the claim was stolen: nothing was committed
    FAILED = "failed"  # a handler failed: nothing was committed, the segment backs off


def advanced(token: Token, upto: int | dict[str, int]) -> Token:
    """``token`` moved on to ``upto`` (a position, or a position per source)."""
    if isinstance(upto, int):
        return token.advance(upto)
    for name, position in upto.items():
        token = token.with_source(name, token.source(name).advance(position))
    return token


class Progress:
    """Told of every token commit in this process, so waiting for a position (read-your-
    writes) wakes at once instead of polling the database."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0

    def advanced(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        """Until a commit after generation ``seen``, or ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen, timeout)


@dataclass(eq=False)
class SegmentState:
    """A claimed segment: its token in memory (ahead of the stored one while ``dirty``), the
    keys parked in the dead-letter table, and whether the claim is still ours."""

    segment: Segment
    token: Token
    parked: set[str] = field(default_factory=set)
    dirty: bool = False
    persisted_at: float = field(default_factory=time.monotonic)
    #: when this node took the claim (monotonic): an extension that began before cannot know it
    claimed_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    crashed: bool = False  # an exception that stops the runner was recorded as its error
    stop: bool = False  # tracking mode: asks the segment's thread to leave its loop
    #: the event (or batch handler) whose handlers are running, and since when (monotonic)
    running: Any = None
    running_since: float = 0.0
    progress: Progress | None = None  # told of each commit (read-your-writes waits)
    handlers_done: float = 0.0  # perf_counter when the last batch's handlers ended (metrics)

    def watch(self, what: Any) -> None:
        self.running = what
        self.running_since = time.monotonic()

    def idle_now(self) -> None:
        self.running = None

    def stuck_for(self, now: float) -> float:
        """Seconds the current handler call has run (0 when none runs)."""
        return now - self.running_since if self.running is not None else 0.0

    def describe_running(self) -> str:
        what = self.running
        if isinstance(what, str):  # already a description (an aggregation's batch of folds)
            return what
        if isinstance(what, Event):
            return f"event {what.position} ({what.type}, {what.stream_id} v{what.version})"
        return f"batch handler {getattr(what, '__name__', what)!r}"

    def moved(self, upto: int | dict[str, int]) -> None:
        """A read passed ``upto`` with nothing to commit for this segment: the token moves in
        memory; it is stored when idle or before the segment is let go."""
        token = advanced(self.token, upto)
        if token != self.token:
            self.token = token
            self.dirty = True

    def committed(self, token: Token) -> None:
        """``token`` is stored (with the effects of the events before it)."""
        self.token = token
        self.dirty = False
        self.persisted_at = time.monotonic()
        if self.progress is not None:
            self.progress.advanced()

    def mark_lost(self) -> None:
        """The claim is gone (stolen, failed, released): nothing more may be committed."""
        self.lost = True

    def wants(self, event: Event, routing_hash: int) -> bool:
        """Whether ``event`` is still to be handled here (a merged token may have seen it)."""
        token = self.token.source(event.source) if event.source else self.token
        return not token.covers(event.position, routing_hash)

    def persist_due(self, every: float = 1.0) -> bool:
        return self.dirty and time.monotonic() - self.persisted_at > every
