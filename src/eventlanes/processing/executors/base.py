"""What every executor shares: the batch span, failures and crashes, tokens that moved in
memory, and the token commit.

An executor runs a processor's batches for the segments this process holds; there is one per
guarantee (:mod:`.exactly_once`, :mod:`.lanes`, :mod:`.republish`, and the aggregations'
:mod:`~eventlanes.processing.aggregating.executor`). The runner and the coordinator call only
:meth:`Executor.handle`, :meth:`~Executor.idle`, :meth:`~Executor.persist`,
:meth:`~Executor.persist_due`, :meth:`~Executor.persist_idle`, :meth:`~Executor.end_round`
and :meth:`~Executor.crashed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import ClaimLostError
from ...events import Event
from ...tokens import Token
from ...tracing import spans
from ..handling.failures import describe, describe_crash
from ..segment import Outcome, SegmentState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..processor import Processor
    from ..runtime import Runtime

log = logging.getLogger("eventlanes.processing")


class Executor:
    """Runs a processor's batches of one segment's events; subclasses implement
    :meth:`process` (handle a batch, commit its token) for their guarantee."""

    def __init__(self, runtime: Runtime, proc: Processor, owner: str) -> None:
        self.runtime = runtime
        self.tokens = runtime.tokens
        self.owner = owner
        self.proc = proc
        self.name = proc.name
        self.policy = proc.policy
        self.observer = runtime.observer
        #: seconds a token that moved in memory (no events of ours) may wait to be stored
        self.persist_every = 1.0

    # -- a batch -------------------------------------------------------------------------------
    def handle(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        """:meth:`process`, what the loops call, in a batch span when tracing is on (links to
        the events' appending spans; :mod:`eventlanes.tracing.spans`). An exception that
        escapes it (a handler raising ``KeyboardInterrupt`` or ``SystemExit``; a bug) stops
        the runner: it is recorded as the segment's error first, so ``status`` shows it."""
        tracer = spans.tracer()
        if tracer is None:
            return self._handle(st, events, upto)
        base = spans.base_attributes(self.name, st.segment, self.proc.guarantee.value,
                                     self.proc.version)  # fmt: skip
        linked, count, first, last = self.traced_events(events)
        token = upto if isinstance(upto, int) else None
        with spans.batch(tracer, "process", base, linked, count, first, last, token,
                         extra=self.trace_attributes(events)) as span:  # fmt: skip
            outcome = self._handle(st, events, upto)
            span.set_attribute(spans.OUTCOME, outcome.value)
            return outcome

    def process(self, st: SegmentState, events: list[Any], upto: int | dict[str, int]) -> Outcome:
        """Handle ``events`` (already filtered for the segment) and move its token to ``upto``
        (per source for multi-source processors)."""
        raise NotImplementedError

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

    # -- the token commit ----------------------------------------------------------------------
    def commit_span(self, st: SegmentState, position: int) -> Span | None:
        """The span of a commit: a child of the batch's span when one records, else None."""
        traced = spans.current()
        return traced.commit(position) if traced is not None else None

    @contextmanager
    def committing(self, st: SegmentState, position: int) -> Iterator[None]:
        """The block in the commit span (:meth:`commit_span`), which records its failure."""
        span = self.commit_span(st, position)
        try:
            yield
        except BaseException as exc:
            spans.ended(span, exc)
            raise
        spans.ended(span)

    def commit_token(
        self,
        st: SegmentState,
        token: Token,
        conn: Any = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Store ``token`` as the segment's, fenced by the claim (:class:`ClaimLostError` when
        it is gone), in the commit span: in ``conn``'s transaction when given, else in one of
        its own. ``then`` runs in the span after the write (the transaction's COMMIT)."""
        with self.committing(st, token.position):
            self.tokens.store(self.name, st.segment.id, token, self.owner, conn=conn)
            if then is not None:
                then()

    def lost(self, st: SegmentState) -> Outcome:
        """The claim is gone (stolen, expired, given up): nothing more commits for it."""
        st.mark_lost()
        return Outcome.LOST

    # -- between batches -----------------------------------------------------------------------
    def read(self, events: Any, after: int, upto: int | dict[str, int]) -> None:
        """The reader read ``events``, every event of the handled types after ``after`` and
        up to ``upto``, before they are shared out (nothing here; a windowed aggregation's
        clock takes them, instead of reading them again)."""

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        """A read moved past ``upto`` without events for this segment: its token moves in
        memory (stored by :meth:`persist`)."""
        st.moved(upto)

    def flush(self, st: SegmentState) -> None:
        """Write what is held in memory for the segment (nothing here; aggregations do)."""

    def end_round(self, states: list[SegmentState]) -> None:
        """The pooled loop's round is over: every batch of it has ended, none runs (nothing
        here; aggregations write their due segments together)."""

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
            self.lost(st)

    def persist_due(self, states: list[SegmentState]) -> None:
        """Store the tokens of ``states`` that moved in memory ``persist_every`` ago."""
        for st in states:
            if st.persist_due(self.persist_every):
                self.persist(st)

    def persist_idle(self, st: SegmentState) -> None:
        """The reader is caught up: a good moment to store a token that moved in memory."""
        self.persist(st)

    # -- failures ------------------------------------------------------------------------------
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
