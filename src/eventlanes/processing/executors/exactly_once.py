"""The exactly-once executor: a segment's batch, its handlers' writes and its token commit in
one transaction, fenced by the claim."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from ...db.weather import is_transient
from ...errors import ClaimLostError
from ...events import Event
from ...tracing import spans
from ..handling.context import Context, lazy
from ..handling.dispatch import Dispatch, Parking, is_replay
from ..handling.failures import BatchHandlerFailed, HandlerFailed, describe, describe_crash
from ..segment import Outcome, SegmentState, advanced

if TYPE_CHECKING:
    from ..processor import Processor
    from ..runtime import Runtime

log = logging.getLogger("eventlanes.processing")

__all__ = [
    "BatchHandlerFailed",
    "HandlerFailed",
    "Outcome",
    "SegmentState",
    "SegmentWorker",
    "advanced",
    "describe",
    "is_replay",
]


class SegmentWorker:
    """Runs a processor's handlers on batches of one segment's events. Executors of other
    guarantees (lanes, aggregations, republishers) subclass it; the runner only calls
    ``process``, ``idle`` and ``persist``."""

    def __init__(self, runtime: Runtime, proc: Processor, owner: str) -> None:
        self.runtime = runtime
        self.tokens = runtime.tokens
        self.owner = owner
        self.proc = proc
        self.name = proc.name
        self.policy = proc.policy
        self.dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
        self.dead_letter = proc.on_error == "dead_letter"
        self.observer = runtime.observer
        #: seconds a token that moved in memory (no events of ours) may wait to be stored
        self.persist_every = 1.0
        #: PostgreSQL and ``pipeline=True``: a batch's statements, token update and commit sent
        #: without a round trip each; a failed pipelined batch is redone plain to blame the
        #: right event. Opt-in: in pipeline mode a cursor's ``rowcount`` is not known (-1)
        #: until a fetch, which silently breaks handlers that branch on it.
        self.pipeline = proc.pipeline and runtime.db.backend == "postgresql"

    def handle(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        """:meth:`process`, what the loops call, in a batch span when tracing is on (links to
        the events' appending spans; :mod:`eventlanes.tracing.spans`). An exception that
        escapes it (a handler raising ``KeyboardInterrupt`` or ``SystemExit``; a bug) stops
        the runner: it is recorded as the segment's error first, so ``status`` shows it."""
        tracer = spans.tracer()
        if tracer is None:
            return self._handle(st, events, upto)
        base = spans.base_attributes(self.name, st.segment, self.proc.guarantee.value,
                                     getattr(self.proc, "version", None))  # fmt: skip
        linked, count, first, last = self.traced_events(events)
        token = upto if isinstance(upto, int) else None
        with spans.batch(tracer, "process", base, linked, count, first, last, token,
                         extra=self.trace_attributes(events)) as span:  # fmt: skip
            outcome = self._handle(st, events, upto)
            span.set_attribute(spans.OUTCOME, outcome.value)
            return outcome

    def traced_events(self, events: Any) -> tuple[list[Event], int, int | None, int | None]:
        """For the batch span: the events to link, how many, the first and last position."""
        return events, len(events), None, None

    def trace_attributes(self, events: Any) -> dict[str, Any] | None:
        """More attributes of the batch span (aggregations: whether SQLite folded it)."""
        return None

    def _handle(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        try:
            return self.process(st, events, upto)
        except BaseException as exc:
            self.crashed(st, exc)
            raise

    def crashed(self, st: SegmentState, exc: BaseException) -> None:
        """Record ``exc``, which stops the runner, as the segment's failure (its batch was
        rolled back) and let the segment go with a back-off, like a failed batch. Nothing is
        logged here: the runner logs the crash, with a note of where it was recorded added to
        ``exc`` (so no other line can come between the crash and its log line)."""
        text = f"the runner crashed: {describe_crash(exc)}"
        st.crashed = True
        if st.lost:  # given up meanwhile: a new claim may hold it now, leave it be
            return
        st.mark_lost()
        self.observer.failed(self.name, str(st.segment), text)
        try:
            self.tokens.fail(self.name, st.segment.id, self.owner, text)
            exc.add_note(f"recorded as the error of segment {st.segment}")
        except Exception as error:  # noqa: BLE001 - the claim expires by itself
            exc.add_note(f"recording it as the error of segment {st.segment} failed: {error}")

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        """Handle ``events`` (already filtered for the segment) and move its token to ``upto``
        (per source for multi-source processors)."""
        new_token = advanced(st.token, upto)
        if self.dead_letter:
            try:
                self._recheck_parked(st, events)
            except Exception as exc:  # noqa: BLE001 - a database error: back off and retry
                return self.back_off(st, exc)
        parking = Parking(st.parked) if self.dead_letter else None
        parked_now: list[int] = []
        pipeline = self.pipeline
        while True:
            if st.lost:  # given up on (stuck, stolen) meanwhile: nothing more may run for it
                return Outcome.LOST
            parked_now.clear()
            started = time.perf_counter()
            try:
                try:
                    self._commit(st, events, new_token, parking, parked_now, pipeline)
                except ClaimLostError:
                    raise
                except Exception as exc:
                    if not pipeline or is_transient(exc):
                        # A lost connection may have lost it after COMMIT was sent: never
                        # redo at once, back off and re-read the stored token instead.
                        raise
                    # In pipeline mode a statement's error surfaces later, on another statement
                    # (perhaps another event's handler): redo the batch without it, so that a
                    # failure is pinned on the event that caused it.
                    pipeline = False
                    continue
            except ClaimLostError as exc:
                log.info("%s %s: claim lost, batch rolled back (%s)", self.name, st.segment, exc)
                st.mark_lost()
                return Outcome.LOST
            except HandlerFailed as exc:
                if parking is None:
                    return self.back_off(st, exc)
                # Park the failed event and every later one of its key, then redo the batch
                # (the failed attempt was rolled back as a whole).
                parking.failed(exc)
                log.warning("%s %s: parking %s", self.name, st.segment, exc.text)
                continue
            except Exception as exc:  # noqa: BLE001 - a database error: back off and retry
                return self.back_off(st, exc)
            handled = len(events) - len(parked_now)
            seconds = st.handlers_done - started  # the commit is reported by _commit
            self.observer.batch_handled(self.name, str(st.segment), handled, seconds)
            if parked_now:
                self.observer.parked(self.name, str(st.segment), len(parked_now))
            st.committed(new_token)
            if parking is not None:
                st.parked.update(parking.keys)
            return Outcome.OK

    def _recheck_parked(self, st: SegmentState, events: list[Event]) -> None:
        """A key parked when the set was last read may have been retried since (its dead
        letters deleted): read the set again before parking one of its new events."""
        if not st.parked:
            return
        key = self.policy.key
        if any(key(e) in st.parked for e in events):
            parked = self.runtime.dead_letters.parked_keys(self.name)
            st.parked = {k for k, h in parked if st.segment.matches(h)}

    def _commit(
        self,
        st: SegmentState,
        events: list[Event],
        new_token: Any,
        parking: Parking | None,
        parked_now: list[int],
        pipeline: bool = False,
    ) -> None:
        db = self.runtime.db
        traced = spans.current()
        commit: Any = None  # its span, when traced: from the token's write to the COMMIT
        try:
            with ExitStack() as stack:
                opened: list[Any] = []

                def begin() -> Any:  # the transaction starts at the first query
                    if not opened:
                        opened.append(stack.enter_context(db.transaction(pipeline=pipeline)))
                    return opened[0]

                def park(event: Event, key: str | None, reason: str) -> None:
                    self.runtime.dead_letters.park(
                        begin(), self.name, event, key, self.policy.routing_hash(event), reason
                    )
                    parked_now.append(event.position)
                    if traced is not None:
                        traced.parked(event, key, reason)

                ctx = Context(
                    self.name, st.segment, st.token, lazy(begin), db.backend, db.param, db.prefix
                )
                try:
                    self.dispatch.run(events, ctx, st.token, parking, park, st.watch)
                finally:
                    st.idle_now()
                if st.lost:  # given up on as stuck (or stolen) while the handlers ran
                    raise ClaimLostError(f"{self.name} {st.segment}: the claim was given up")
                started = st.handlers_done = time.perf_counter()
                if traced is not None:
                    commit = traced.commit(new_token.position)
                self.tokens.store(self.name, st.segment.id, new_token, self.owner, conn=begin())
        except BaseException as exc:
            spans.ended(commit, exc)
            raise
        spans.ended(commit)
        self.observer.committed(self.name, str(st.segment), time.perf_counter() - started)

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        """A read moved past ``upto`` without events for this segment."""
        st.moved(upto)

    def flush(self, st: SegmentState) -> None:
        """Write what is held in memory for the segment (nothing here; aggregations do)."""

    def persist(self, st: SegmentState) -> None:
        """Store the segment's token if it moved in memory (with what is held for it)."""
        if st.lost:
            return
        self.flush(st)
        if not st.dirty or st.lost:
            return
        try:
            self.tokens.store(self.name, st.segment.id, st.token, self.owner)
            st.committed(st.token)
        except ClaimLostError:
            st.mark_lost()

    def persist_idle(self, st: SegmentState) -> None:
        """The reader is caught up: a good moment to store a token that moved in memory."""
        self.persist(st)

    def back_off(self, st: SegmentState, exc: BaseException) -> Outcome:
        """Record the failure (the segment is retried with back-off, on any node) and let the
        segment go."""
        text = describe(exc)
        spans.failed(exc, text)
        if st.lost:  # already given up (stuck): a new claim may hold it now, leave it be
            log.error("%s %s failed after it was given up: %s", self.name, st.segment, text)
            return Outcome.LOST
        self.observer.failed(self.name, str(st.segment), text)
        try:
            delay = self.tokens.fail(self.name, st.segment.id, self.owner, text)
            log.error(
                "%s %s failed, retrying in %.0f s on any node: %s",
                self.name,
                st.segment,
                delay,
                text,
            )
        except ClaimLostError:
            pass
        except Exception as error:  # noqa: BLE001 - the database is down too: the claim expires
            log.error("%s %s failed (%s); recording it failed too: %s", self.name, st.segment,
                      text, error)  # fmt: skip
        st.mark_lost()
        return Outcome.FAILED
