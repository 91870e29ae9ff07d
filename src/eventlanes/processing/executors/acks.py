"""Ordered acknowledgement of events handled in parallel lanes.

A segment's events are dispatched in store order to concurrent lanes and finish out of order. A
token may only move to the highest position whose event and every earlier one are done
(invariant 3: nothing lost). The tracker keeps intervals of finished sequence indices rather than
one entry per index, and bounds the in-flight window, so its memory follows the window, never the
backlog (invariant 7).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence

from ...errors import BackpressureError, HandlerTimeoutError, InvalidInputError

__all__ = ["BackpressureError", "CommitTracker", "HandlerTimeoutError"]

# Done indices are kept as intervals split per block of 2**_BITS indices: each block's sorted list
# stays short, so inserting an interval moves a few hundred bytes instead of a window-sized list.
_BITS = 6

# dispatch_async polls: done() may come from any thread, and an asyncio.Event is not thread-safe
_POLL_SECONDS = 0.002


class CommitTracker:
    """Tracks events dispatched to parallel lanes and says which position is safe to commit.

    Every dispatched event gets the next sequence index (0, 1, 2, ...). ``committable`` returns
    the position of the last event of the contiguous run of done indices from 0, so a token never
    passes an event that is still running or that failed. Thread-safe: lanes may be threads, or
    asyncio tasks calling ``done`` on the loop thread (use ``dispatch_async`` there).
    """

    def __init__(
        self,
        window: int = 10_000,
        commit_every: int = 1_000,
        commit_interval: float = 1.0,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1:
            raise InvalidInputError(f"window must be at least 1, got {window}")
        if commit_every < 1:
            raise InvalidInputError(f"commit_every must be at least 1, got {commit_every}")
        if timeout is not None and timeout <= 0:
            raise InvalidInputError(f"timeout must be positive or None, got {timeout}")
        self._window = window
        self._commit_every = commit_every
        self._commit_interval = commit_interval
        self._timeout = timeout
        self._clock = clock
        # Hot paths call the plain Lock's acquire/release directly (about half the cost of a
        # `with` block on CPython 3.11); the Condition shares the lock and is only touched when a
        # dispatcher is actually waiting.
        self._lock = threading.Lock()
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._next = 0  # the index the next dispatch gets
        self._base = 0  # every index below it is done: the contiguous prefix
        self._last_position: int | None = None
        # Positions (and dispatch times, only when timing out) of indices offset.._next-1, with
        # offset <= base-1; trimmed in bulk so memory is O(window) without a pop per event.
        self._positions: list[int] = []
        self._times: list[float] | None = [] if timeout is not None else None
        self._offset = 0
        # Done indices above the prefix: block number -> flat half-open intervals inside the block
        # [s0, e0, s1, e1, ...], sorted and never touching, so one bisect tells "inside an
        # interval" by parity. Pieces may touch across a block edge; the prefix walks over them.
        # Blocks the prefix passes are deleted, so at most window / 64 + 2 exist.
        self._blocks: dict[int, list[int]] = {}
        self._trim = max(window, 1024)
        self._failures: dict[int, BaseException] = {}
        self._failed_at: int | None = None  # lowest failed index: the prefix stops below it
        self._emitted = 0  # _base when committable last returned a position
        self._emitted_at = clock()

    # -- dispatch -------------------------------------------------------------------------

    def dispatch(self, position: int, block: bool = True, wait: float | None = None) -> int:
        """Register the next event (in store order) and return its sequence index.

        Blocks while ``window`` events are in flight, so the reader stops reading instead of
        buffering the backlog; raises BackpressureError at once (``block=False``), after ``wait``
        seconds, or when a failure means the window can never drain.
        """
        deadline: float | None = None
        self._acquire()
        try:
            while True:
                last = self._last_position
                if last is not None and position <= last:
                    raise InvalidInputError(
                        f"positions must strictly increase: got {position} after {last}"
                    )
                if self._next - self._base < self._window:
                    break
                if deadline is None and wait is not None:
                    deadline = time.monotonic() + wait
                self._wait_for_room(block, wait, deadline)
            index = self._next
            self._next = index + 1
            self._last_position = position
            self._positions.append(position)
            if self._times is not None:
                self._times.append(self._clock())
            return index
        finally:
            self._release()

    def dispatch_many(
        self, positions: Sequence[int], block: bool = True, wait: float | None = None
    ) -> range:
        """``dispatch`` for a batch read from the store, under one lock; returns its indices.

        Waits until the whole batch fits in the window, so a batch larger than it is refused.
        """
        count = len(positions)
        if count > self._window:
            raise InvalidInputError(f"a batch of {count} cannot fit a window of {self._window}")
        if any(map(operator.ge, positions, itertools.islice(positions, 1, None))):
            at = next(i for i in range(1, count) if positions[i] <= positions[i - 1])
            raise InvalidInputError(
                f"positions must strictly increase: got {positions[at]} after {positions[at - 1]}"
            )
        deadline: float | None = None
        self._acquire()
        try:
            while True:
                last = self._last_position
                if count and last is not None and positions[0] <= last:
                    raise InvalidInputError(
                        f"positions must strictly increase: got {positions[0]} after {last}"
                    )
                if self._next - self._base + count <= self._window:
                    break
                if deadline is None and wait is not None:
                    deadline = time.monotonic() + wait
                self._wait_for_room(block, wait, deadline)
            first = self._next
            if count:
                self._next = first + count
                self._last_position = positions[-1]
                self._positions.extend(positions)
                if self._times is not None:
                    self._times.extend(itertools.repeat(self._clock(), count))
            return range(first, first + count)
        finally:
            self._release()

    def _wait_for_room(self, block: bool, wait: float | None, deadline: float | None) -> None:
        # Called with the lock held and the window full; returns after one wake-up.
        failed_at = self._failed_at
        if failed_at is not None and self._base >= failed_at:
            raise BackpressureError(
                f"window of {self._window} is full and index {failed_at} failed: "
                "it will never drain"
            ) from self._failures[failed_at]
        if not block:
            raise BackpressureError(
                f"{self._next - self._base} events in flight: the window of {self._window} is full"
            )
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise BackpressureError(f"no room in the window of {self._window} within {wait} s")
        self._waiting += 1
        try:
            self._cond.wait(remaining)
        finally:
            self._waiting -= 1

    async def dispatch_async(self, position: int, wait: float | None = None) -> int:
        """Like ``dispatch``, but awaits room so lanes on the same loop keep running."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                return self.dispatch(position, block=False)
            except BackpressureError:
                if self._stuck() or (deadline is not None and time.monotonic() >= deadline):
                    raise
            await asyncio.sleep(_POLL_SECONDS)

    def _stuck(self) -> bool:
        with self._lock:
            return self._failed_at is not None and self._base >= self._failed_at

    # -- completion -----------------------------------------------------------------------

    def done(self, index: int) -> None:
        """A lane finished the event with this index."""
        self._acquire()
        try:
            self._mark(index)
            if self._waiting:
                self._cond.notify_all()
        finally:
            self._release()

    def done_many(self, indices: Iterable[int]) -> None:
        """``done`` for many indices under one lock acquisition (a lane finishing a batch)."""
        with self._lock:
            mark = self._mark
            for index in indices:
                mark(index)
            if self._waiting:
                self._cond.notify_all()

    def _mark(self, index: int) -> None:
        # Lock held. The in-order case (index == base) is the hot path: no bisect, no block.
        if self._failures and index in self._failures:
            return  # a timed-out handler finished late: its failure stands
        base = self._base
        if index == base and index < self._next:
            base += 1
            if self._blocks:
                base = self._absorb(base)
            self._base = base
            cut = base - 1 - self._offset  # keep the position of base - 1 for committable
            if cut >= self._trim:
                del self._positions[:cut]
                if self._times is not None:
                    del self._times[:cut]
                self._offset += cut
        elif base < index < self._next:
            blocks = self._blocks
            key = index >> _BITS
            blk = blocks.get(key)
            if blk is None:
                blocks[key] = [index, index + 1]
                return
            k = bisect_right(blk, index)
            if k & 1:  # an odd slot lies inside [start, end)
                raise InvalidInputError(f"index {index} is already done")
            left = k and blk[k - 1] == index
            right = k < len(blk) and blk[k] == index + 1
            if left:
                if right:
                    del blk[k - 1 : k + 1]  # fills the gap between two intervals
                else:
                    blk[k - 1] = index + 1
            elif right:
                blk[k] = index
            else:
                blk[k:k] = (index, index + 1)
        elif 0 <= index < base:
            raise InvalidInputError(f"index {index} is already done (every index below {base} is)")
        else:
            raise InvalidInputError(
                f"index {index} was never dispatched (next index is {self._next})"
            )

    def _absorb(self, base: int) -> int:
        # The prefix reached base: swallow the intervals that start exactly there.
        blocks = self._blocks
        while True:
            key = base >> _BITS
            blk = blocks.get(key)
            if blk is None or blk[0] != base:
                return base
            base = blk[1]
            if len(blk) > 2:
                del blk[:2]
                return base  # the block's next interval starts above base: a gap
            del blocks[key]  # loop: the interval may go on in the next block

    def _run_end(self, index: int) -> int:
        # End of the done interval piece holding index (index >= base), or index if not done.
        blk = self._blocks.get(index >> _BITS)
        if blk is None:
            return index
        k = bisect_right(blk, index)
        return blk[k] if k & 1 else index

    def fail(self, index: int, error: BaseException) -> None:
        """A lane failed the event: the prefix stops before it, so it is never committed."""
        with self._lock:
            if index in self._failures:
                return  # e.g. a timed-out handler raising late: the first failure stands
            if index >= self._next or index < 0:
                raise InvalidInputError(
                    f"index {index} was never dispatched (next index is {self._next})"
                )
            if self._is_done(index):
                raise InvalidInputError(f"index {index} is already done; it cannot fail")
            self._record_failure(index, error)

    def _record_failure(self, index: int, error: BaseException) -> None:
        self._failures[index] = error
        if self._failed_at is None or index < self._failed_at:
            self._failed_at = index
        if self._waiting:
            self._cond.notify_all()  # a full window may now never drain: waiters must hear

    def _is_done(self, index: int) -> bool:
        return index < self._base or self._run_end(index) > index

    def check_timeouts(self) -> list[int]:
        """Fail (with HandlerTimeoutError) and return indices in flight longer than ``timeout``.

        A handler that never ends would otherwise hold the prefix back forever.
        """
        if self._timeout is None or self._times is None:
            return []
        expired: list[int] = []
        with self._lock:
            limit = self._clock() - self._timeout
            times, offset, failures = self._times, self._offset, self._failures
            index, end = self._base, self._next
            # dispatch times never decrease, so stop at the first index that is young enough
            while index < end and times[index - offset] < limit:
                run_end = self._run_end(index)
                if run_end > index:
                    index = run_end  # skip a run of done indices
                    continue
                if index not in failures:
                    self._record_failure(
                        index,
                        HandlerTimeoutError(
                            f"handler for index {index} (position "
                            f"{self._positions[index - offset]}) still running after "
                            f"{self._timeout} s"
                        ),
                    )
                    expired.append(index)
                index += 1
        return expired

    # -- commit ---------------------------------------------------------------------------

    def committable(self, force: bool = False) -> int | None:
        """The position to commit now, or None when nothing new or throttled.

        Returns the highest position whose event and all earlier ones are done, if newer than
        the last returned, and only when ``commit_every`` events joined the prefix since then,
        ``commit_interval`` seconds passed, ``force`` is set, or the prefix has reached a
        failure (commit what is contiguous before failing; it cannot grow any more).
        """
        # Throttling is decided without the lock (reads of single attributes are atomic): a stale
        # read only moves a commit to the next call. The position itself is read under the lock.
        base = self._base
        emitted = self._emitted
        if base == emitted:
            return None
        if (
            not force
            and base - emitted < self._commit_every
            and base != self._failed_at
            and self._clock() - self._emitted_at < self._commit_interval
        ):
            return None
        self._acquire()
        try:
            base = self._base
            if base == self._emitted:
                return None
            self._emitted = base
            self._emitted_at = self._clock()
            return self._positions[base - 1 - self._offset]
        finally:
            self._release()

    def raise_if_failed(self) -> None:
        """Raise the failure the prefix stopped at (the lowest failed index), once the prefix
        has reached it, so callers can first commit everything before it."""
        with self._lock:
            failed_at = self._failed_at
            if failed_at is None or self._base < failed_at:
                return
            error = self._failures[failed_at]
        raise error

    @property
    def in_flight(self) -> int:
        """Dispatched events not yet in the contiguous prefix (what the window bounds)."""
        with self._lock:
            return self._next - self._base

    @property
    def contiguous(self) -> int | None:
        """Highest position with every earlier event done, ignoring throttling (None: none)."""
        with self._lock:
            if self._base == 0:
                return None
            return self._positions[self._base - 1 - self._offset]

    @property
    def failed(self) -> bool:
        """Whether any event failed or timed out."""
        return self._failed_at is not None
