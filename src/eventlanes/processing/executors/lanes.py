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
from ..handling.dispatch import never_ran
from ..handling.failures import HandlerFailed
from ..segment import Outcome, SegmentState, advanced
from .acks import CommitTracker
from .exactly_once import SegmentWorker

if TYPE_CHECKING:
    from ..processor import Processor
    from ..runtime import Runtime

log = logging.getLogger("eventlanes.processing")


class LaneWorker(SegmentWorker):
    def __init__(self, runtime: Runtime, proc: Processor, owner: str) -> None:
        super().__init__(runtime, proc, owner)
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

    def _commit_token(self, st: SegmentState, position: int) -> None:
        token = st.token.advance(position)
        self._store(st, token)
        st.committed(token)

    def _store(self, st: SegmentState, token: Any) -> None:
        """Store the segment's token (in a commit span when the batch is traced)."""
        traced = spans.current()
        commit = traced.commit(token.position) if traced is not None else None
        try:
            self.tokens.store(self.name, st.segment.id, token, self.owner)
        except BaseException as exc:
            spans.ended(commit, exc)
            raise
        spans.ended(commit)

    async def _run(self, st: SegmentState, events: list[Event], upto: Any) -> Outcome:
        tracker = CommitTracker(window=self.window, commit_every=500, commit_interval=0.5)
        queues: list[asyncio.Queue[tuple[int, Event] | None]] = [
            asyncio.Queue() for _ in range(self.lanes)
        ]
        db = self.runtime.db
        ctx = Context(self.name, st.segment, st.token, None, db.backend, db.param, db.prefix)
        dispatch = self.dispatch
        traced = spans.current()  # the batch span, when recording: a child per handler call

        async def call(handler: Any, event: Event) -> None:
            result = handler(event, ctx)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, self.handler_timeout)
            elif result is not None:
                never_ran(result, handler)

        async def lane(queue: asyncio.Queue[tuple[int, Event] | None]) -> None:
            stopped = False
            while (item := await queue.get()) is not None:
                index, event = item
                if stopped or st.lost:
                    continue  # behind a failure, or the claim is gone: runs again elsewhere
                replay = dispatch.replayed(st.token, event)
                try:
                    for handler in dispatch.for_event(event, replay):
                        if traced is None:
                            await call(handler, event)
                        else:
                            with traced.handler(event, handler, replay):
                                await call(handler, event)
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

        async def committer() -> None:
            while not st.lost:
                await asyncio.sleep(0.05)
                position = tracker.committable()
                if position is None:
                    continue
                try:
                    self._commit_token(st, position)
                except ClaimLostError:
                    st.mark_lost()  # the lanes stop taking events; the batch ends LOST
                except Exception as exc:  # noqa: BLE001 - retried at the next tick, or at the end
                    log.warning("%s %s: committing %s failed: %s", self.name, st.segment,
                                position, exc)  # fmt: skip

        workers = [asyncio.create_task(lane(q)) for q in queues]
        commits = asyncio.create_task(committer())
        try:
            for event in events:
                key = self.policy.key(event)
                index = await tracker.dispatch_async(event.position)
                lane_no = stable_hash(key if key is not None else f"#{event.position}") % self.lanes
                queues[lane_no].put_nowait((index, event))
            for queue in queues:
                queue.put_nowait(None)
            await asyncio.gather(*workers)
        except Exception as exc:  # noqa: BLE001 - e.g. backpressure after a failure
            for task in workers:
                task.cancel()
            return self._finish_failed(st, tracker, exc)
        finally:
            commits.cancel()
        if st.lost:  # events were skipped once the claim went: commit nothing more
            return Outcome.LOST
        try:
            if tracker.failed:
                return self._finish_failed(st, tracker, None)
            new_token = advanced(st.token, upto)
            self._store(st, new_token)
            st.committed(new_token)
            return Outcome.OK
        except ClaimLostError:
            st.mark_lost()
            return Outcome.LOST
        except Exception as exc:  # noqa: BLE001 - a database error: back off and retry
            return self.back_off(st, exc)

    def _finish_failed(self, st: SegmentState, tracker: CommitTracker, exc: Any) -> Outcome:
        """Commit what is contiguous before the failure, then back off."""
        try:
            position = tracker.committable(force=True)
            if position is not None:
                self._commit_token(st, position)
            tracker.raise_if_failed()
            if exc is not None:
                raise exc
        except ClaimLostError:
            st.mark_lost()
            return Outcome.LOST
        except Exception as error:  # noqa: BLE001
            return self.back_off(st, error)
        return Outcome.OK
