"""The at-least-once executor: parallel lanes within a segment, acked in order.

With ``guarantee="at-least-once", lanes=K`` a claimed segment's events are spread over K asyncio
lanes by the stable hash of their sequence key (same key, same lane, in order). Completions
arrive out of order; the segment's token only advances through a
:class:`~eventlanes.processing.executors.acks.CommitTracker`, to the highest position whose
event and every earlier
one are done, committed at most every N events or T seconds. This is the at-least-once path (no
shared transaction). What the pattern assumes, and how each assumption is kept:

* unique, increasing offsets: store positions; the tracker refuses anything else;
* idempotent handlers: after a crash or a failure, events past the committed position run
  again; handlers get ``event.position`` / ``event.idempotency_key`` to dedupe on;
* handlers that end: each call is cancelled after ``handler_timeout`` seconds and counts as a
  failure (a hung handler would otherwise stall the token forever).

A failure stops its lane (later events of its keys must not overtake it); the other lanes
finish, the contiguous prefix before the failure is committed, then the segment backs off.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from ...errors import ClaimLostError, HandlerTimeoutError
from ...events import Event
from ...hashing import stable_hash
from ...tracing import spans
from ..handling.context import Context
from ..handling.dispatch import Dispatch, never_ran
from ..handling.failures import HandlerFailed
from ..segment import Outcome, SegmentState, advanced
from .acks import CommitTracker
from .base import Executor

if TYPE_CHECKING:
    from ...tracing.spans import Batch
    from ..processor import Processor
    from ..runtime import Runtime

log = logging.getLogger("eventlanes.processing")

#: a lane's queue: (the event's index in the tracker, the event), then None to end
Lane = asyncio.Queue[tuple[int, Event] | None]


class LaneExecutor(Executor):
    def __init__(self, runtime: Runtime, proc: Processor, owner: str) -> None:
        super().__init__(runtime, proc, owner)
        self.dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
        self.lanes = proc.lanes
        self.handler_timeout = proc.handler_timeout
        self.window = proc.lane_window

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        started = time.perf_counter()
        outcome = asyncio.run(self._run(st, events, upto))
        if outcome is Outcome.OK:
            seconds = time.perf_counter() - started
            self.observer.batch_handled(self.name, str(st.segment), len(events), seconds)
        return outcome

    def _commit_done(self, st: SegmentState, position: int) -> None:
        """Commit the token up to ``position``, the last of the events done so far in order."""
        token = st.token.advance(position)
        self.commit_token(st, token)
        st.committed(token)

    async def _run(self, st: SegmentState, events: list[Event], upto: Any) -> Outcome:
        tracker = CommitTracker(window=self.window, commit_every=500, commit_interval=0.5)
        queues: list[Lane] = [asyncio.Queue() for _ in range(self.lanes)]
        ctx = Context.for_batch(self.runtime.db, self.name, st.segment, st.token)
        traced = spans.current()  # the batch span, when recording: a child per handler call
        workers = [asyncio.create_task(self._lane(st, ctx, tracker, q, traced)) for q in queues]
        commits = asyncio.create_task(self._committer(st, tracker))
        try:
            await self._spread(events, tracker, queues)
            await asyncio.gather(*workers)
        except Exception as exc:  # noqa: BLE001 - e.g. backpressure after a failure
            for task in workers:
                task.cancel()
            return self._finish_failed(st, tracker, exc)
        finally:
            commits.cancel()
        return self._finish(st, tracker, upto)

    async def _spread(
        self, events: list[Event], tracker: CommitTracker, queues: list[Lane]
    ) -> None:
        """Hand the events out in order, each to the lane of its key (the same key, the same
        lane), as the tracker's window lets them in; then end every lane."""
        key_of, lanes = self.policy.key, self.lanes
        for event in events:
            key = key_of(event)
            index = await tracker.dispatch_async(event.position)
            lane_no = stable_hash(key if key is not None else f"#{event.position}") % lanes
            queues[lane_no].put_nowait((index, event))
        for queue in queues:
            queue.put_nowait(None)

    async def _lane(
        self,
        st: SegmentState,
        ctx: Context,
        tracker: CommitTracker,
        queue: Lane,
        traced: Batch | None,
    ) -> None:
        """One lane: its events' handlers in order; a failure stops the lane (later events of
        its keys must not overtake it) and is reported to the tracker."""
        dispatch = self.dispatch
        stopped = False
        while (item := await queue.get()) is not None:
            index, event = item
            if stopped or st.lost:
                continue  # behind a failure, or the claim is gone: runs again elsewhere
            replay = dispatch.replayed(st.token, event)
            try:
                for handler in dispatch.for_event(event, replay):
                    if traced is None:
                        await self._call(st, handler, event, ctx)
                    else:
                        with traced.handler(event, handler, replay):
                            await self._call(st, handler, event, ctx)
            except TimeoutError:
                stopped = True
                tracker.fail(index, HandlerTimeoutError(
                    f"event {event.position} ({event.type}): handler did not finish within "
                    f"{self.handler_timeout} s"))  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - reported with the event
                stopped = True
                tracker.fail(index, HandlerFailed(event, self.policy.key(event), exc))
            else:
                tracker.done(index)

    async def _call(self, st: SegmentState, handler: Any, event: Event, ctx: Context) -> None:
        # A sync handler runs on the lanes' loop, which waits for it: bounded by the segment's
        # watchdog, as a plain processor's handlers are (an async one: by wait_for below).
        st.watch(event)
        try:
            result = handler(event, ctx)
        finally:
            st.idle_now()
        if inspect.isawaitable(result):
            await asyncio.wait_for(result, self.handler_timeout)
        elif result is not None:
            never_ran(result, handler)

    async def _committer(self, st: SegmentState, tracker: CommitTracker) -> None:
        """While the lanes run: commit what is done in order, every 50 ms at most."""
        while not st.lost:
            await asyncio.sleep(0.05)
            position = tracker.committable()
            if position is None:
                continue
            try:
                self._commit_done(st, position)
            except ClaimLostError:
                self.lost(st)  # the lanes stop taking events; the batch ends LOST
            except Exception as exc:  # noqa: BLE001 - retried at the next tick, or at the end
                log.warning("%s %s: committing %s failed: %s", self.name, st.segment,
                            position, exc)  # fmt: skip

    def _finish(self, st: SegmentState, tracker: CommitTracker, upto: Any) -> Outcome:
        """Every lane ended: commit the batch's token, or what is done before a failure."""
        if st.lost:  # events were skipped once the claim went: commit nothing more
            return Outcome.LOST
        try:
            if tracker.failed:
                return self._finish_failed(st, tracker, None)
            new_token = advanced(st.token, upto)
            self.commit_token(st, new_token)
            st.committed(new_token)
            return Outcome.OK
        except ClaimLostError:
            return self.lost(st)
        except Exception as exc:  # noqa: BLE001 - a database error: back off and retry
            return self.back_off(st, exc)

    def _finish_failed(self, st: SegmentState, tracker: CommitTracker, exc: Any) -> Outcome:
        """Commit what is contiguous before the failure, then back off."""
        try:
            position = tracker.committable(force=True)
            if position is not None:
                self._commit_done(st, position)
            tracker.raise_if_failed()
            if exc is not None:
                raise exc
        except ClaimLostError:
            return self.lost(st)
        except Exception as error:  # noqa: BLE001
            return self.back_off(st, error)
        return Outcome.OK
