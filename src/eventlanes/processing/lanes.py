"""Parallel lanes within a segment: slow I/O handlers run concurrently, acked in order.

With ``lanes=K`` a claimed segment's events are spread over K asyncio lanes by the stable hash
of their sequence key (same key, same lane, in order). Completions arrive out of order; the
segment's token only advances through a :class:`~eventlanes.acks.CommitTracker`, to the highest
position whose event and every earlier one are done, committed at most every N events or T
seconds. This is the at-least-once path (no shared transaction). What the pattern assumes, and
how each assumption is kept:

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
import time
from typing import Any

from ..acks import CommitTracker, HandlerTimeoutError
from ..errors import ClaimLostError
from ..events import Event
from ..hashing import stable_hash
from .context import Context
from .handlers import runs_on_replay
from .worker import HandlerFailed, Outcome, SegmentState, SegmentWorker, advanced, is_replay


class LaneWorker(SegmentWorker):
    def __init__(self, runner: Any, lanes: int, handler_timeout: float, window: int) -> None:
        super().__init__(runner)
        self.lanes = lanes
        self.handler_timeout = handler_timeout
        self.window = window

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        return asyncio.run(self._run(st, events, upto))

    def _commit_token(self, st: SegmentState, position: int) -> None:
        token = st.token.advance(position)
        self.runner.tokens.store(self.name, st.segment.id, token, self.runner.owner)
        st.token = token
        st.persisted_at = time.monotonic()

    async def _run(self, st: SegmentState, events: list[Event], upto: Any) -> Outcome:
        started = time.perf_counter()  # observe
        tracker = CommitTracker(window=self.window, commit_every=500, commit_interval=0.5)
        queues: list[asyncio.Queue[tuple[int, Event] | None]] = [
            asyncio.Queue() for _ in range(self.lanes)
        ]
        db = self.runner.db
        ctx = Context(self.name, st.segment, st.token, None, db.backend, db.param, db.prefix)
        handlers = self.handlers

        async def lane(queue: asyncio.Queue[tuple[int, Event] | None]) -> None:
            stopped = False
            while (item := await queue.get()) is not None:
                index, event = item
                if stopped:
                    continue  # behind a failure of this lane: runs again after the back-off
                replay = is_replay(st.token, event)
                try:
                    for handler in handlers.for_type(event.type):
                        if replay and not runs_on_replay(handler):
                            continue
                        result = handler(event, ctx)
                        if inspect.isawaitable(result):
                            await asyncio.wait_for(result, self.handler_timeout)
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
            while True:
                await asyncio.sleep(0.05)
                position = tracker.committable()
                if position is not None:
                    self._commit_token(st, position)

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
        try:
            if tracker.failed:
                return self._finish_failed(st, tracker, None)
            new_token = advanced(st.token, upto)
            st.handled_at = time.perf_counter()  # observe
            self.runner.tokens.store(self.name, st.segment.id, new_token, self.runner.owner)
            st.token = new_token
            st.dirty = False
            self._observe(st, len(events), started)  # observe
            return Outcome.OK
        except ClaimLostError:
            st.lost = True
            return Outcome.LOST

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
            st.lost = True
            return Outcome.LOST
        except Exception as error:  # noqa: BLE001
            return self._back_off(st, error)
        return Outcome.OK
