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
from ...tokens import Token
from ...tracing import spans
from ..handling.context import Context, lazy
from ..handling.dispatch import Dispatch, Parking
from ..handling.failures import HandlerFailed
from ..segment import Outcome, SegmentState, advanced
from .base import Executor

if TYPE_CHECKING:
    from ..processor import Processor
    from ..runtime import Runtime

log = logging.getLogger("eventlanes.processing")


class TransactionalExecutor(Executor):
    """Runs a batch's handlers in the transaction that stores the segment's token: their
    writes to the token store's database commit with it, or not at all."""

    def __init__(self, runtime: Runtime, proc: Processor, owner: str) -> None:
        super().__init__(runtime, proc, owner)
        self.dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
        self.dead_letter = proc.on_error == "dead_letter"
        #: PostgreSQL and ``pipeline=True``: a batch's statements, token update and commit sent
        #: without a round trip each; a failed pipelined batch is redone plain to blame the
        #: right event. Opt-in: in pipeline mode a cursor's ``rowcount`` is not known (-1)
        #: until a fetch, which silently breaks handlers that branch on it.
        self.pipeline = proc.pipeline and runtime.db.backend == "postgresql"

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
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
                return self.lost(st)
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
        new_token: Token,
        parking: Parking | None,
        parked_now: list[int],
        pipeline: bool = False,
    ) -> None:
        """The batch's handlers, then its token, in one transaction (opened by the first query,
        so CPU work before it runs outside SQLite's write lock)."""
        db = self.runtime.db
        traced = spans.current()
        with ExitStack() as stack:
            opened: list[Any] = []

            def begin() -> Any:  # the transaction starts at the first query
                if not opened:
                    opened.append(stack.enter_context(db.transaction(pipeline=pipeline)))
                return opened[0]

            def park(event: Event, key: str | None, reason: str, replay: bool) -> None:
                self.runtime.dead_letters.park(
                    begin(),
                    self.name,
                    event,
                    key,
                    self.policy.routing_hash(event),
                    reason,
                    replay,
                )
                parked_now.append(event.position)
                if traced is not None:
                    traced.parked(event, key, reason)

            ctx = Context.for_batch(db, self.name, st.segment, st.token, lazy(begin))
            try:
                self.dispatch.run(events, ctx, st.token, parking, park, st.watch)
            finally:
                st.idle_now()
            if st.lost:  # given up on as stuck (or stolen) while the handlers ran
                raise ClaimLostError(f"{self.name} {st.segment}: the claim was given up")
            started = st.handlers_done = time.perf_counter()
            # The commit span runs from the token's write to the COMMIT (closing the stack).
            self.commit_token(st, new_token, begin(), then=stack.close)
        self.observer.committed(self.name, str(st.segment), time.perf_counter() - started)
