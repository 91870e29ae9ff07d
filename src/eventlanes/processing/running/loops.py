"""The two ways a runner reads: pooled (one reader for every held segment) and tracking (one
reader thread per held segment)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ...db.weather import Backoff, is_transient
from ...events import Event
from ...store.notify import Wakeup
from ...tokens import Token
from ..executors.base import Executor
from ..segment import Outcome, SegmentState, advanced
from .coordinator import Coordinator
from .reader import Batch, BatchReader, Upto

log = logging.getLogger("eventlanes.processing")


def weather(
    coordinator: Coordinator, exc: BaseException, backoff: Backoff, stopping: threading.Event
) -> None:
    """Note a passing database failure (logged once per outage, and its end once) and wait
    before the next try; the next round checks every claim again (one may have expired
    meanwhile: fencing keeps that exact)."""
    delay = backoff.next()
    coordinator.outage.failed(exc, delay)
    backoff.on_recovery = coordinator.outage.ok  # the next success ends the outage
    coordinator.force_next()
    stopping.wait(delay)


@dataclass(frozen=True)
class ReadAhead:
    """The next batch, read while the current one was handled, from the tokens the held
    segments were to have once it committed. Good only if every one of them has exactly those
    now (a failure, a lost claim, a new or changed segment: read again)."""

    states: tuple[SegmentState, ...]
    tokens: tuple[Token, ...]
    seen: int  # the wake-up generation before the read
    events: Batch
    upto: Upto
    moved: bool

    def fits(self, states: list[SegmentState]) -> bool:
        return len(states) == len(self.states) and all(
            st is mine and not st.lost and st.token == token
            for st, mine, token in zip(states, self.states, self.tokens, strict=True)
        )


class PooledLoop:
    """One reader thread reads the store once, from the lowest held token, and hands each held
    segment's share of a batch to a worker pool; the next batch starts when the segments of
    this one have committed. Segments change only between batches, on this thread. While a
    batch is handled, the next one is read (from the tokens the batch will leave): it is
    handed out only if the batch committed everywhere and the held segments did not change,
    so no event is handed out twice or out of order."""

    def __init__(
        self,
        coordinator: Coordinator,
        reader: BatchReader,
        executor: Executor,
        wakeup: Wakeup,
        stopping: threading.Event,
        threads: int,
    ) -> None:
        self.coordinator = coordinator
        self.reader = reader
        self.executor = executor
        self.wakeup = wakeup
        self.stopping = stopping
        self.threads = threads
        self.abandoned = 0  # handler threads given up on as stuck
        self.ahead: ReadAhead | None = None

    def run(self) -> None:
        name = self.coordinator.name
        self.pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=f"el-{name}")
        backoff = Backoff()
        crash: BaseException | None = None
        try:
            while not self.stopping.is_set():
                try:
                    self._round()
                    backoff.reset()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    weather(self.coordinator, exc, backoff, self.stopping)
        except BaseException as exc:
            crash = exc
            raise
        finally:
            self.pool.shutdown(wait=not self.abandoned)
            if crash is not None:
                self.coordinator.crashed(crash)
            self.coordinator.release_all()

    def _round(self) -> None:
        """One batch: coordinate, read (or take the batch read ahead), hand the segments'
        shares to the pool, read the next batch, wait."""
        coordinator, executor = self.coordinator, self.executor
        ahead, self.ahead = self.ahead, None  # used once at most, whatever happens
        if coordinator.coordinate():
            ahead = None  # claims, splits, merges may have changed the held segments
            states = [st for st in coordinator.claimed.values() if not st.lost]
            coordinator.refresh_parked(states)
            executor.persist_due(states)
        states = [st for st in coordinator.claimed.values() if not st.lost]
        if not states:
            self.wakeup.wait(self.wakeup.generation, coordinator.interval)
            return
        if ahead is not None and ahead.fits(states):
            seen, events, upto, moved = ahead.seen, ahead.events, ahead.upto, ahead.moved
        else:
            seen = self.wakeup.generation
            events, upto, moved = self.reader.read(states)
        if not events and not moved:
            executor.end_round(states)
            for st in states:  # idle: a good moment to persist advanced tokens
                executor.persist_idle(st)
            self.wakeup.wait(seen)
            return
        shares, upto, carry = self.reader.cut(self.reader.share(states, events), events, upto)
        executor.read(events, min(st.token.position for st in states), upto)
        # Where every held segment will be once this batch committed (taken before a worker
        # can change a token).
        tokens = tuple(advanced(st.token, upto) for st in states)
        futures = {
            self.pool.submit(executor.handle, st, evs, upto): st
            for st, evs in shares.items()
            if evs
        }
        for st, evs in shares.items():
            if not evs:
                executor.idle(st, upto)
        # The events past a cut start the next batch (not read again), the read ahead the rest.
        following = self._read_ahead(states, tokens, carry) if futures or carry else None
        if self._wait(futures):
            # A stuck handler keeps its thread: leave it, and go on with a fresh pool.
            self.pool.shutdown(wait=False)
            self.pool = ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix=f"el-{coordinator.name}"
            )
            return
        executor.end_round(states)
        self.ahead = following

    def _read_ahead(
        self,
        states: list[SegmentState],
        tokens: tuple[Token, ...],
        carry: tuple[list[Event], Upto] | None = None,
    ) -> ReadAhead | None:
        """The next batch, read while the workers handle this one (the database works on the
        read while handlers run); None when it could not be read (read again next round).
        ``carry``: the events past this batch's cut and how far they are complete: the next
        batch starts with them, and the read goes on from there."""
        if self.stopping.is_set():
            return None
        seen = self.wakeup.generation
        start = tokens if carry is None else tuple(advanced(t, carry[1]) for t in tokens)
        try:
            events, upto, moved = self.reader.read(states, start)
        except Exception as exc:  # noqa: BLE001 - the next round reads again and reports it
            log.debug("%s: read ahead failed: %s", self.coordinator.name, exc)
            if carry is None:
                return None
            events, upto, moved = [], carry[1], True
        if carry is not None:
            if type(events) is not list:  # a range folded in SQL: the carried events alone
                events, upto = [], carry[1]
            assert isinstance(upto, int) and isinstance(carry[1], int)  # cuts: one source
            events, upto, moved = carry[0] + events, max(upto, carry[1]), True
        return ReadAhead(tuple(states), tokens, seen, events, upto, moved)

    def _wait(self, futures: dict[Future[Outcome], SegmentState]) -> bool:
        """Wait for the batch's segments; True when one was given up as stuck (its thread is
        left behind: Python cannot stop it) so the loop can go on with the others."""
        pending = set(futures)
        abandoned = False
        error: BaseException | None = None
        while pending:
            done, pending = wait(pending, timeout=self.coordinator.interval)
            for future in done:  # LOST and FAILED states are dropped by coordinate()
                failure = future.exception()
                if failure is not None:
                    # Its batch may or may not have committed: let the segment go (re-claimed
                    # from the stored token), and raise only once every other batch has ended,
                    # so no segment is ever handed out while its batch still runs.
                    futures[future].mark_lost()
                    error = error or failure
            stuck = {f for f in pending if futures[f].lost and futures[f].running is not None}
            if stuck:
                for future in stuck:
                    log.error("%s %s: left a stuck handler thread behind", self.coordinator.name,
                              futures[future].segment)  # fmt: skip
                self.abandoned += len(stuck)
                pending -= stuck
                abandoned = True
                # Shares queued behind a stuck one on its thread would never run: nothing of
                # them started, so they are dropped and read again by the next round.
                pending = {f for f in pending if not f.cancel()}
        if error is not None:
            raise error
        return abandoned


class TrackingLoop:
    """One thread per held segment, each reading with its own (SQL-filtered) cursor; this
    thread only coordinates, stopping a segment's thread before the segment changes."""

    def __init__(
        self,
        coordinator: Coordinator,
        reader: BatchReader,
        executor: Executor,
        wakeup: Wakeup,
        stopping: threading.Event,
        guard: Callable[[Callable[[], None]], Callable[[], None]],
    ) -> None:
        self.coordinator = coordinator
        self.reader = reader
        self.executor = executor
        self.wakeup = wakeup
        self.stopping = stopping
        self.guard = guard
        self.threads: dict[int, threading.Thread] = {}

    def run(self) -> None:
        coordinator = self.coordinator
        backoff = Backoff()
        crash: BaseException | None = None
        try:
            while not self.stopping.is_set():
                try:
                    coordinator.coordinate(drop=self._stop_thread)
                    backoff.reset()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    weather(coordinator, exc, backoff, self.stopping)
                    continue
                for seg_id, st in list(coordinator.claimed.items()):
                    thread = self.threads.get(seg_id)
                    if thread is None or not thread.is_alive():
                        if st.lost:
                            coordinator.claimed.pop(seg_id, None)
                            continue
                        thread = threading.Thread(
                            target=self.guard(lambda st=st: self._segment(st)),  # type: ignore[misc]
                            name=f"eventlanes-{coordinator.name}-{st.segment}",
                            daemon=True,
                        )
                        self.threads[seg_id] = thread
                        thread.start()
                self.stopping.wait(coordinator.interval)
        except BaseException as exc:
            crash = exc
            raise
        finally:
            for st in list(coordinator.claimed.values()):
                self._stop_thread(st)
            if crash is not None:
                coordinator.crashed(crash)
            coordinator.release_all()

    def _stop_thread(self, st: SegmentState) -> None:
        thread = self.threads.pop(st.segment.id, None)
        if thread is not None:
            st.stop = True
            self.wakeup.notify()
            while thread.is_alive():
                thread.join(self.coordinator.interval)
                if st.lost and st.running is not None:
                    log.error("%s %s: left a stuck handler thread behind", self.coordinator.name,
                              st.segment)  # fmt: skip
                    break
            st.stop = False

    def _segment(self, st: SegmentState) -> None:
        backoff = Backoff()
        while not self.stopping.is_set() and not st.stop and not st.lost:
            try:
                self._segment_rounds(st)
                backoff.reset()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                weather(self.coordinator, exc, backoff, self.stopping)
        self.executor.persist(st)

    def _segment_rounds(self, st: SegmentState) -> None:
        executor, coordinator = self.executor, self.coordinator
        refresh_at = time.monotonic() + coordinator.interval
        while not self.stopping.is_set() and not st.stop and not st.lost:
            seen = self.wakeup.generation
            events, upto, moved = self.reader.read([st])
            executor.read(events, st.token.position, upto)
            mine = self.reader.share([st], events)[st] if events else []
            if mine:
                if executor.handle(st, mine, upto) is not Outcome.OK:
                    return
            elif moved:
                executor.idle(st, upto)
                if st.persist_due(executor.persist_every):
                    executor.persist(st)
            else:
                executor.persist_idle(st)
                self.wakeup.wait(seen)
            if time.monotonic() > refresh_at:
                refresh_at = time.monotonic() + coordinator.interval
                coordinator.refresh_parked([st])
