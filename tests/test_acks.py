"""CommitTracker: ordered acknowledgement of events finished out of order by parallel lanes
(DESIGN.md section 4; invariants 3 "nothing lost" and 7 "bounded memory")."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlanes.processing.executors import acks
from eventlanes.processing.executors.acks import (
    BackpressureError,
    CommitTracker,
    HandlerTimeoutError,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entries(tracker: CommitTracker) -> int:
    return sum(len(b) for b in tracker._blocks.values())


# -- the reference model ---------------------------------------------------------------


class Model:
    """The obvious implementation: a set of done indices, the prefix found by scanning."""

    def __init__(self, window: int, commit_every: int, interval: float, timeout: float) -> None:
        self.window, self.commit_every, self.interval, self.timeout = (
            window,
            commit_every,
            interval,
            timeout,
        )
        self.positions: list[int] = []
        self.times: list[float] = []
        self.done: set[int] = set()
        self.failed: dict[int, BaseException] = {}
        self.emitted = 0
        self.emitted_at = 0.0

    def prefix(self) -> int:
        i = 0
        while i < len(self.positions) and i in self.done:
            i += 1
        return i

    def pending(self) -> list[int]:
        return [i for i in range(len(self.positions)) if i not in self.done | set(self.failed)]

    def contiguous(self) -> int | None:
        p = self.prefix()
        return self.positions[p - 1] if p else None

    def committable(self, now: float, force: bool) -> int | None:
        p = self.prefix()
        if p == self.emitted:
            return None
        stuck = bool(self.failed) and p == min(self.failed)
        due = p - self.emitted >= self.commit_every or now - self.emitted_at >= self.interval
        if not (force or due or stuck):
            return None
        self.emitted, self.emitted_at = p, now
        return self.positions[p - 1]


OPS = ["dispatch", "dispatch_many", "done", "done", "done", "fail", "late", "dup", "commit"]
OPS += ["commit_forced", "tick", "timeouts"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_matches_reference_model(data: st.DataObject) -> None:
    # Small blocks make interval pieces cross block edges often, as large windows do.
    bits = data.draw(st.sampled_from([1, 2, 6]), label="bits")
    window = data.draw(st.integers(1, 40), label="window")
    commit_every = data.draw(st.integers(1, 5), label="commit_every")
    clock = FakeClock()
    model = Model(window, commit_every, interval=10.0, timeout=5.0)
    model.emitted_at = clock.now
    with mock.patch.object(acks, "_BITS", bits):
        t = CommitTracker(window, commit_every, commit_interval=10.0, timeout=5.0, clock=clock)
        position = 0
        for _ in range(data.draw(st.integers(0, 150), label="steps")):
            op = data.draw(st.sampled_from(OPS))
            pending = model.pending()
            if op in ("dispatch", "dispatch_many"):
                count = 1 if op == "dispatch" else data.draw(st.integers(0, 4))
                new = []
                for _ in range(count):
                    position += data.draw(st.integers(1, 3))
                    new.append(position)
                if count > window:
                    with pytest.raises(ValueError, match="cannot fit"):
                        t.dispatch_many(new, block=False)
                    position = model.positions[-1] if model.positions else 0
                    continue
                if len(model.positions) - model.prefix() + count > window:
                    with pytest.raises(BackpressureError):
                        if op == "dispatch":
                            t.dispatch(new[0], block=False)
                        else:
                            t.dispatch_many(new, block=False)
                    position = model.positions[-1] if model.positions else 0
                    continue
                first = len(model.positions)
                if op == "dispatch":
                    assert t.dispatch(new[0], block=False) == first
                else:
                    assert t.dispatch_many(new, block=False) == range(first, first + count)
                model.positions += new
                model.times += [clock.now] * count
            elif op == "done" and pending:
                i = data.draw(st.sampled_from(pending))
                t.done(i)
                model.done.add(i)
            elif op == "fail" and pending:
                i = data.draw(st.sampled_from(pending))
                error = RuntimeError(f"lane failed {i}")
                t.fail(i, error)
                model.failed[i] = error
            elif op == "late" and model.failed:
                t.done(data.draw(st.sampled_from(sorted(model.failed))))  # ignored
            elif op == "dup" and model.done:
                i = data.draw(st.sampled_from(sorted(model.done)))
                with pytest.raises(ValueError, match="already done"):
                    t.done(i)
                with pytest.raises(ValueError, match="already done"):
                    t.fail(i, RuntimeError("x"))
            elif op in ("commit", "commit_forced"):
                force = op == "commit_forced"
                got = t.committable(force=force)
                assert got == model.committable(clock.now, force)
                if got is not None:  # never passes an unfinished event
                    assert all(i in model.done for i, p in enumerate(model.positions) if p <= got)
            elif op == "tick":
                clock.now += data.draw(st.sampled_from([0.5, 1.0, 3.0, 6.0]))
            elif op == "timeouts":
                expected = [i for i in pending if clock.now - model.times[i] > model.timeout]
                assert t.check_timeouts() == expected
                for i in expected:
                    model.failed[i] = HandlerTimeoutError()
            # invariants after every step
            assert t.contiguous == model.contiguous()
            assert t.in_flight == len(model.positions) - model.prefix()
            assert t.failed == bool(model.failed)
            lowest = min(model.failed, default=None)
            if lowest is not None and model.prefix() == lowest:
                with pytest.raises(type(model.failed[lowest])) as caught:
                    t.raise_if_failed()
                if not isinstance(caught.value, HandlerTimeoutError):
                    assert caught.value is model.failed[lowest]
            else:
                t.raise_if_failed()


# -- the article's case and failures -----------------------------------------------------


def test_front_wheel_fails_after_roller_is_done_nothing_is_committed() -> None:
    t = CommitTracker(commit_every=1)
    front_wheel = t.dispatch(1)  # Carlo's front wheel, first in the store
    roller = t.dispatch(2)  # Rolanda's roller
    t.done(roller)
    error = RuntimeError("front-wheel handler failed")
    t.fail(front_wheel, error)
    assert t.committable(force=True) is None
    assert t.contiguous is None
    assert t.failed
    with pytest.raises(RuntimeError) as caught:
        t.raise_if_failed()
    assert caught.value is error


def test_commits_what_is_contiguous_before_the_failure_then_raises() -> None:
    t = CommitTracker(commit_every=1_000)  # throttled: the failure must not delay the commit
    frame, front_wheel, roller, bell = (t.dispatch(p) for p in (10, 11, 12, 13))
    t.done(roller)
    t.fail(front_wheel, ValueError("front wheel"))
    t.raise_if_failed()  # not yet: the frame, before it, is still running
    t.done(frame)
    t.done(bell)
    assert t.committable() == 10  # unthrottled: the prefix cannot grow past the failure
    assert t.committable(force=True) is None
    with pytest.raises(ValueError, match="front wheel"):
        t.raise_if_failed()


def test_lowest_failed_index_is_the_one_raised() -> None:
    t = CommitTracker()
    for p in range(5):
        t.dispatch(p)
    t.fail(3, RuntimeError("three"))
    t.fail(1, RuntimeError("one"))
    t.done(0)
    assert t.committable(force=True) == 0
    with pytest.raises(RuntimeError, match="one"):
        t.raise_if_failed()


def test_hung_handler_times_out() -> None:
    clock = FakeClock()
    t = CommitTracker(timeout=30.0, clock=clock)
    first, hung, third = t.dispatch(100), t.dispatch(101), t.dispatch(102)
    t.done(first)
    t.done(third)
    clock.now += 30.0
    assert t.check_timeouts() == []  # not longer than the timeout yet
    clock.now += 0.5
    assert t.check_timeouts() == [hung]
    assert t.check_timeouts() == []  # failed once only
    assert t.committable(force=True) == 100
    with pytest.raises(HandlerTimeoutError, match="index 1 .position 101"):
        t.raise_if_failed()
    t.done(hung)  # the handler ends late: its failure stands
    assert t.contiguous == 100
    t.fail(hung, RuntimeError("late"))  # ignored too
    with pytest.raises(HandlerTimeoutError):
        t.raise_if_failed()


def test_timeouts_only_touch_old_unfinished_events() -> None:
    clock = FakeClock()
    t = CommitTracker(timeout=5.0, clock=clock)
    old = [t.dispatch(p) for p in range(4)]
    clock.now += 10
    young = t.dispatch(50)
    t.done(old[1])
    assert t.check_timeouts() == [0, 2, 3]
    assert young not in t._failures
    assert CommitTracker().check_timeouts() == []  # no timeout configured


# -- backpressure --------------------------------------------------------------------------


def test_full_window_refuses_without_blocking() -> None:
    t = CommitTracker(window=3)
    for p in range(3):
        t.dispatch(p)
    with pytest.raises(BackpressureError, match="window of 3 is full"):
        t.dispatch(3, block=False)
    t.done(1)  # done but not contiguous: still in flight
    with pytest.raises(BackpressureError):
        t.dispatch(3, block=False)
    with pytest.raises(BackpressureError, match="within 0.05 s"):
        t.dispatch(3, wait=0.05)
    t.done(0)
    assert t.in_flight == 1
    assert t.dispatch(3, block=False) == 3


def test_blocked_dispatch_resumes_after_done() -> None:
    t = CommitTracker(window=2)
    t.dispatch(1)
    t.dispatch(2)
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(t.dispatch(3)))
    thread.start()
    time.sleep(0.05)
    assert got == [] and thread.is_alive()
    t.done(0)
    thread.join(5)
    assert got == [2]


def test_blocked_dispatch_gives_up_when_a_failure_means_no_room_ever() -> None:
    t = CommitTracker(window=1)
    t.dispatch(1)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            t.dispatch(2)
        except BackpressureError as e:
            errors.append(e)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    t.fail(0, RuntimeError("boom"))
    thread.join(5)
    assert len(errors) == 1 and "never drain" in str(errors[0])


def test_dispatch_async_awaits_room() -> None:
    async def scenario() -> list[int]:
        t = CommitTracker(window=2)
        indices = [await t.dispatch_async(p) for p in (1, 2)]

        async def lane() -> None:
            await asyncio.sleep(0.02)
            t.done(0)

        task = asyncio.create_task(lane())
        indices.append(await t.dispatch_async(3))  # the loop keeps running the lane
        await task
        with pytest.raises(BackpressureError):
            await t.dispatch_async(4, wait=0.01)
        return indices

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_dispatch_many_waits_for_room_for_the_whole_batch() -> None:
    t = CommitTracker(window=4)
    assert t.dispatch_many([1, 2, 3]) == range(0, 3)
    with pytest.raises(BackpressureError):
        t.dispatch_many([4, 5], block=False)
    t.done_many([2, 0])
    assert t.dispatch_many([4, 5]) == range(3, 5)
    with pytest.raises(ValueError, match="cannot fit a window of 4"):
        t.dispatch_many(range(10, 15))


# -- throttling ----------------------------------------------------------------------------


def test_commit_every_n_events() -> None:
    t = CommitTracker(commit_every=3, commit_interval=3600)
    for p in range(10):
        t.done(t.dispatch(p * 10))
        got = t.committable()
        assert got == (p * 10 if p in (2, 5, 8) else None)
    assert t.contiguous == 90
    assert t.committable(force=True) == 90
    assert t.committable(force=True) is None  # nothing newer


def test_commit_interval() -> None:
    clock = FakeClock()
    t = CommitTracker(commit_every=1_000, commit_interval=2.0, clock=clock)
    t.done(t.dispatch(7))
    assert t.committable() is None
    clock.now += 1.9
    assert t.committable() is None
    clock.now += 0.1
    assert t.committable() == 7
    t.done(t.dispatch(8))
    clock.now += 1.0
    assert t.committable() is None  # the interval restarts at each returned position
    clock.now += 1.0
    assert t.committable() == 8
    clock.now += 10
    assert t.committable() is None  # time passed but nothing new


# -- bounded memory and concurrency ------------------------------------------------------------


def test_memory_is_bounded_by_the_window_not_the_event_count() -> None:
    window, chunk, total = 2_000, 1_000, 1_000_000
    t = CommitTracker(window=window, commit_every=chunk)
    rng = random.Random(7)
    order = list(range(chunk))
    dispatch, done = t.dispatch, t.done
    for p in range(chunk):
        dispatch(p * 2)
    peak_blocks = peak_entries = peak_positions = 0
    committed = None
    for start in range(0, total, chunk):
        if start + chunk < total:  # keep the next chunk in flight: the window is full
            for p in range(start + chunk, start + 2 * chunk):
                dispatch(p * 2)
        rng.shuffle(order)
        for n, j in enumerate(order):
            done(start + j)
            if n % 50 == 0:
                peak_blocks = max(peak_blocks, len(t._blocks))
                peak_entries = max(peak_entries, _entries(t))
                peak_positions = max(peak_positions, len(t._positions))
        committed = t.committable() or committed
    assert committed == (total - 1) * 2
    assert t.committable(force=True) is None  # already returned
    assert t.contiguous == (total - 1) * 2
    assert peak_blocks <= window // 64 + 2
    assert peak_entries <= window
    assert peak_positions <= 2 * window + 1
    assert t._blocks == {} and t._failures == {}
    assert t.in_flight == 0


def test_lane_threads_completing_concurrently() -> None:
    t = CommitTracker(window=500, commit_every=100)
    total, lanes = 20_000, 4
    queues: list[list[int]] = [[] for _ in range(lanes)]
    cv = threading.Condition()
    finished = threading.Event()

    def lane(q: list[int]) -> None:
        while True:
            with cv:
                while not q and not finished.is_set():
                    cv.wait(0.01)
                batch, q[:] = q[:], []
            if not batch and finished.is_set():
                return
            random.shuffle(batch)
            for i in batch:
                t.done(i)

    threads = [threading.Thread(target=lane, args=(q,)) for q in queues]
    for th in threads:
        th.start()
    commits = []
    for p in range(total):
        index = t.dispatch(p * 3 + 1)  # blocks when the lanes fall behind
        with cv:
            queues[p % lanes].append(index)
            cv.notify_all()
        got = t.committable()
        if got is not None:
            commits.append(got)
    finished.set()
    for th in threads:
        th.join(10)
    final = t.committable(force=True)
    commits += [final] if final is not None else []
    assert commits == sorted(commits) and commits[-1] == (total - 1) * 3 + 1


# -- bad input ---------------------------------------------------------------------------------


def test_positions_must_strictly_increase() -> None:
    t = CommitTracker()
    t.dispatch(5)
    with pytest.raises(ValueError, match="got 5 after 5"):
        t.dispatch(5)
    with pytest.raises(ValueError, match="got 3 after 5"):
        t.dispatch(3)
    with pytest.raises(ValueError, match="got 7 after 8"):
        t.dispatch_many([6, 8, 7])
    with pytest.raises(ValueError, match="got 4 after 5"):
        t.dispatch_many([4, 9])
    assert t.dispatch(6) == 1


def test_unknown_and_duplicate_indices() -> None:
    t = CommitTracker()
    t.dispatch(1)
    t.dispatch(2)
    with pytest.raises(ValueError, match="index 2 was never dispatched"):
        t.done(2)
    with pytest.raises(ValueError, match="index -1 was never dispatched"):
        t.done(-1)
    with pytest.raises(ValueError, match="index 5 was never dispatched"):
        t.fail(5, RuntimeError())
    t.done(1)
    with pytest.raises(ValueError, match="index 1 is already done"):
        t.done(1)
    t.done(0)
    with pytest.raises(ValueError, match="index 0 is already done"):
        t.done(0)
    with pytest.raises(ValueError, match="already done; it cannot fail"):
        t.fail(1, RuntimeError())
    with pytest.raises(ValueError, match="window must be at least 1"):
        CommitTracker(window=0)
