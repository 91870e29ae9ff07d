"""Handling one segment's batch: handlers and token in one transaction, fenced by the claim."""

from __future__ import annotations

import logging
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import ClaimLostError
from ..events import Event
from ..segments import Segment
from ..tokens import Token
from .context import Context, lazy
from .handlers import runs_on_replay

if TYPE_CHECKING:
    from .runner import ProcessorRunner

log = logging.getLogger("eventlanes.processing")


class Outcome(Enum):
    OK = "ok"
    LOST = "lost"  # the claim was stolen: nothing was committed
    FAILED = "failed"  # a handler failed: nothing was committed, the segment backs off


@dataclass(eq=False)
class SegmentState:
    """What this process knows about a segment it holds."""

    segment: Segment
    token: Token
    parked: set[str] = field(default_factory=set)  # keys with events in the dead-letter table
    dirty: bool = False  # token advanced in memory (no events of ours), not yet persisted
    persisted_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    stop: bool = False  # tracking mode: asks the segment's thread to leave its loop
    handled_at: float = 0.0  # observe
    batch_parked: int = 0  # observe


def is_replay(token: Token, event: Event) -> bool:
    return token.source(event.source).is_replay(event.position)


def advanced(token: Token, upto: int | dict[str, int]) -> Token:
    """``token`` moved on to ``upto`` (a position, or a position per source)."""
    if isinstance(upto, int):
        return token.advance(upto)
    for name, position in upto.items():
        token = token.with_source(name, token.source(name).advance(position))
    return token


class HandlerFailed(Exception):
    def __init__(self, event: Event, key: str | None, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.event = event
        self.key = key
        self.error = error
        self.text = (
            f"event {event.position} ({event.type}, {event.stream_id} v{event.version}): "
            + "".join(traceback.format_exception_only(type(error), error)).strip()
        )


class BatchHandlerFailed(Exception):
    def __init__(self, handler: object, error: BaseException) -> None:
        name = getattr(handler, "__name__", repr(handler))
        self.text = (
            f"batch handler {name}: "
            + "".join(traceback.format_exception_only(type(error), error)).strip()
        )
        super().__init__(self.text)


def describe(exc: BaseException) -> str:
    if isinstance(exc, HandlerFailed | BatchHandlerFailed):
        return exc.text
    return f"{type(exc).__name__}: {exc}"


class SegmentWorker:
    """Runs a processor's handlers on batches of one segment's events."""

    def __init__(self, runner: ProcessorRunner) -> None:
        self.runner = runner
        proc = runner.processor
        self.name = proc.name
        self.policy = proc.policy
        self.handlers = proc.handlers
        self.dead_letter = proc.on_error == "dead_letter"

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        """Handle ``events`` (already filtered for the segment) and move its token to ``upto``
        (per source for multi-source processors)."""
        new_token = advanced(st.token, upto)
        park_keys: dict[str, int] = {}  # key -> position of its first failed event
        park_events: dict[int, str] = {}
        while True:
            started = time.perf_counter()  # observe
            try:
                self._commit(st, events, new_token, park_keys, park_events)
            except ClaimLostError as exc:
                log.info("%s %s: claim lost, batch rolled back (%s)", self.name, st.segment, exc)
                st.lost = True
                return Outcome.LOST
            except HandlerFailed as exc:
                if not self.dead_letter:
                    return self._back_off(st, exc)
                # Park the failed event and every later one of its key, then redo the batch
                # (the failed attempt was rolled back as a whole).
                park_events[exc.event.position] = exc.text
                if exc.key is not None:
                    park_keys.setdefault(exc.key, exc.event.position)
                log.warning("%s %s: parking %s", self.name, st.segment, exc.text)
                continue
            except Exception as exc:  # noqa: BLE001 - a database error: back off and retry
                return self._back_off(st, exc)
            st.token = new_token
            st.dirty = False
            st.persisted_at = time.monotonic()
            st.parked.update(park_keys)
            self._observe(st, len(events), started)  # observe
            return Outcome.OK

    def _commit(
        self,
        st: SegmentState,
        events: list[Event],
        new_token: Token,
        park_keys: dict[str, int],
        park_events: dict[int, str],
    ) -> None:
        runner = self.runner
        db = runner.db
        with ExitStack() as stack:
            opened: list[Any] = []

            def begin() -> Any:  # the transaction starts at the first query
                if not opened:
                    opened.append(stack.enter_context(db.transaction()))
                return opened[0]

            ctx = Context(
                self.name, st.segment, st.token, lazy(begin), db.backend, db.param, db.prefix
            )
            token = st.token
            parked = st.parked
            check_parking = bool(parked or park_keys or park_events)
            st.batch_parked = 0  # observe
            batch_handlers = self.handlers.batch_handlers
            handled: list[Event] = []
            for event in events:
                if check_parking:
                    key = self.policy.key(event)
                    reason = park_events.get(event.position)
                    if (
                        reason is None
                        and key is not None
                        and (
                            key in parked or park_keys.get(key, event.position + 1) < event.position
                        )
                    ):
                        reason = "waiting behind an earlier failed event of the same key"
                    if reason is not None:
                        runner.dead_letters.park(
                            begin(), self.name, event, key, self.policy.routing_hash(event), reason
                        )
                        st.batch_parked += 1  # observe
                        continue
                replay = is_replay(token, event)
                ctx.is_replay = replay
                for handler in self.handlers.for_type(event.type):
                    if replay and not runs_on_replay(handler):
                        continue
                    try:
                        handler(event, ctx)
                    except Exception as exc:  # noqa: BLE001 - reported with the event
                        raise HandlerFailed(event, self.policy.key(event), exc) from exc
                if batch_handlers:
                    handled.append(event)
            for types, handler in batch_handlers:
                chosen = [
                    e for e in handled
                    if (types is None or e.type in types)
                    and (runs_on_replay(handler) or not is_replay(token, e))
                ]  # fmt: skip
                if chosen:
                    ctx.is_replay = False
                    try:
                        handler(chosen, ctx)
                    except Exception as exc:  # noqa: BLE001
                        raise BatchHandlerFailed(handler, exc) from exc
            st.handled_at = time.perf_counter()  # observe
            runner.tokens.store(self.name, st.segment.id, new_token, runner.owner, conn=begin())

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        """A read moved past ``upto`` without events for this segment: move the token on (in
        memory; the runner persists it when idle or before letting the segment go)."""
        token = advanced(st.token, upto)
        if token != st.token:
            st.token = token
            st.dirty = True

    def flush(self, st: SegmentState) -> None:
        """Write what is held in memory for the segment (nothing here; aggregations do)."""

    def _observe(self, st: SegmentState, events: int, started: float) -> None:  # observe
        """Report a committed batch: handler time up to the token write, commit time after."""
        observer, segment = self.runner.observer, str(st.segment)
        done = time.perf_counter()
        handled_at = st.handled_at if st.handled_at >= started else done
        observer.batch_handled(self.name, segment, events - st.batch_parked, handled_at - started)
        observer.committed(self.name, segment, done - handled_at)
        if st.batch_parked:
            observer.parked(self.name, segment, st.batch_parked)

    def _back_off(self, st: SegmentState, exc: BaseException) -> Outcome:
        text = describe(exc)
        self.runner.observer.failed(self.name, str(st.segment), text)  # observe
        try:
            delay = self.runner.tokens.fail(self.name, st.segment.id, self.runner.owner, text)
            log.error(
                "%s %s failed, retrying in %.0f s on any node: %s",
                self.name,
                st.segment,
                delay,
                text,
            )
        except ClaimLostError:
            pass
        st.lost = True
        return Outcome.FAILED
