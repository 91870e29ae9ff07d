"""Running one processor in this process: claiming segments, reading, handling, committing.

* Pooled (default): one reader thread reads the store once, from the lowest claimed token, and
  hands each claimed segment's share of a batch to a worker pool; the next batch starts when the
  segments of this one have committed. Segments only change (claims, releases, splits, merges)
  between batches, on the reader thread.
* Tracking: one thread per claimed segment, each reading with its own (SQL-filtered) cursor.

A heartbeat thread extends claims while handlers run, so a slow batch does not lose its claim.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..errors import ClaimLostError, InvalidInputError
from ..events import Event
from ..notify import Wakeup, wakeup_for
from ..segments import Segment
from .sources import read_merged
from .worker import Outcome, SegmentState, SegmentWorker

if TYPE_CHECKING:
    from ..app import App
    from .processor import Processor

log = logging.getLogger("eventlanes.processing")


def node_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class ProcessorRunner:
    """One processor, in this process. ``start()`` returns at once; ``stop()`` finishes the
    batch in hand, stores tokens and releases the claims."""

    def __init__(
        self,
        app: App,
        processor: Processor,
        owner: str | None = None,
        static: tuple[int, int] | None = None,
        wakeup: Wakeup | None = None,
    ) -> None:
        self.app = app
        self.processor = processor
        self.name = processor.name
        self.store = app.store
        self.db = app.db
        self.tokens = app.tokens
        self.dead_letters = app.dead_letters
        self.owner = owner or node_name()
        if static is not None:
            index, nodes = static
            if not (isinstance(nodes, int) and nodes >= 1 and 0 <= index < nodes):
                raise InvalidInputError(f"static mode needs 0 <= node index < nodes, got {static}")
        self.static = static
        self.wakeup = wakeup or wakeup_for(self.store, app.poll_interval)
        self._own_wakeup = wakeup is None
        self.worker: SegmentWorker = processor.make_worker(self)
        # The app's store first ("" is its name), then the processor's other sources.
        self.sources = [("", self.store)] + [
            (name, app.source_store(target)) for name, target in processor.sources.items()
        ]
        self.claimed: dict[int, SegmentState] = {}
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._segment_threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        interval = app.tokens.claim_timeout / 3
        self.heartbeat_interval = interval
        self.coordinate_interval = min(1.0, interval)
        self._next_coordinate = 0.0
        self.error: BaseException | None = None
        self.observer = app.observer  # observe

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.tokens.initialize(
            self.name, segments=self.processor.segments, initial=self.processor.initial,
            store=self.store,
        )  # fmt: skip
        self.tokens.heartbeat(self.name, self.owner)
        main = self._pooled_loop if self.processor.mode == "pooled" else self._tracking_loop
        for target, label in ((main, "main"), (self._heartbeat_loop, "heartbeat")):
            thread = threading.Thread(
                target=self._guard(target), name=f"eventlanes-{self.name}-{label}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop() and status
                log.exception("%s: runner thread crashed", self.name)
                self.error = exc
                self.stopping.set()

        return run

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        self.wakeup.notify()
        for thread in self._threads:
            thread.join(timeout)
        if self._own_wakeup:
            self.wakeup.close()

    def _shutdown(self) -> None:
        """On the main thread, after the last batch: persist tokens, release, leave."""
        for seg_id, st in list(self.claimed.items()):
            self._persist(st)
            self.tokens.release(self.name, seg_id, self.owner)
        self.claimed.clear()
        self.observer.claims(self.name, 0)  # observe
        self.tokens.leave(self.name, self.owner)

    # -- claims --------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.heartbeat_interval):
            try:
                held = set(self.tokens.extend_all(self.name, self.owner))
                self.tokens.heartbeat(self.name, self.owner)
            except Exception as exc:  # noqa: BLE001 - the database may come back
                log.warning("%s: heartbeat failed: %s", self.name, exc)
                continue
            with self._lock:
                for seg_id, st in self.claimed.items():
                    if seg_id not in held:
                        st.lost = True

    def _limit(self, total: int) -> int:
        """How many segments this node may hold: its fair share among live nodes."""
        live = max(1, len(self.tokens.live_nodes(self.name)))
        fair = math.ceil(total / live)
        if self.processor.max_segments is not None:
            fair = min(fair, self.processor.max_segments)
        return fair

    def coordinate(self, before_change: Callable[[SegmentState], None] | None = None) -> None:
        """Claim, release, split and merge; only called while no batch is in flight."""
        now = time.monotonic()
        if now < self._next_coordinate:
            return
        self._next_coordinate = now + self.coordinate_interval
        status = {s.segment.id: s for s in self.tokens.status(self.name)}
        drop = before_change or (lambda st: None)
        for seg_id, st in list(self.claimed.items()):
            row = status.get(seg_id)
            if st.lost or row is None or row.owner != self.owner or row.segment != st.segment:
                drop(st)
                self.claimed.pop(seg_id, None)
        self._handle_requests(status, drop)
        limit: int | None = None  # static mode takes its fixed segments, no fair-share cap
        if self.static is not None:
            index, nodes = self.static
            ids = sorted(status)
            wanted = [ids[i] for i in range(index, len(ids), nodes)]
            for seg_id in list(self.claimed):
                if seg_id not in wanted:
                    self._release(self.claimed[seg_id], drop, hold_off=0.0)
        else:
            wanted = sorted(status)
            limit = self._limit(len(status))
            while len(self.claimed) > limit:  # give the surplus to nodes that are waiting
                surplus = self.claimed[max(self.claimed)]
                self._release(surplus, drop, hold_off=self.coordinate_interval * 3)
            if len(self.claimed) >= limit:
                wanted = []
        for seg_id in wanted:
            if seg_id in self.claimed:
                continue
            if limit is not None and len(self.claimed) >= limit:
                break
            row = status[seg_id]
            if row.owner not in (None, self.owner) and (row.claim_expires_in or 0) > 0:
                continue
            if row.retry_in:
                continue
            record = self.tokens.claim(self.name, seg_id, self.owner)
            if record is not None:
                self._acquire(record.segment, record.token)
        self.observer.claims(self.name, len(self.claimed))  # observe
        if self.processor.mode == "pooled":  # tracking threads do this for themselves
            parked = self._parked_keys()
            for st in self.claimed.values():
                if st.dirty and time.monotonic() - st.persisted_at > 1.0:
                    self._persist(st)
                if parked is not None:
                    st.parked = {k for k, h in parked if st.segment.matches(h)}

    def _parked_keys(self) -> list[tuple[str, int]] | None:
        """Keys with parked events (dead-letter mode). Read on the thread that processes the
        segments, between batches, so a key it just parked is always in the table already;
        keys whose dead letters were retried elsewhere disappear here."""
        if self.processor.on_error != "dead_letter":
            return None
        return self.dead_letters.parked_keys(self.name)

    def _acquire(self, segment: Segment, token) -> SegmentState:  # type: ignore[no-untyped-def]
        st = SegmentState(segment, token)
        parked = self._parked_keys()
        if parked:
            st.parked = {k for k, h in parked if segment.matches(h)}
        with self._lock:
            self.claimed[segment.id] = st
        log.info("%s: %s claimed %s at %s", self.name, self.owner, segment, token)
        return st

    def _release(
        self, st: SegmentState, drop: Callable[[SegmentState], None], hold_off: float
    ) -> None:
        drop(st)
        self._persist(st)
        self.tokens.release(self.name, st.segment.id, self.owner, hold_off=hold_off)
        self.claimed.pop(st.segment.id, None)

    def _persist(self, st: SegmentState) -> None:
        if st.lost:
            return
        self.worker.flush(st)  # work held in memory (aggregations) is written with its token
        if not st.dirty or st.lost:
            return
        try:
            self.tokens.store(self.name, st.segment.id, st.token, self.owner)
            st.dirty = False
            st.persisted_at = time.monotonic()
        except ClaimLostError:
            st.lost = True

    def _handle_requests(self, status, drop) -> None:  # type: ignore[no-untyped-def]
        for seg_id, st in list(self.claimed.items()):
            request = status[seg_id].request if seg_id in status else None
            if request is None:
                continue
            try:
                if request == "release":
                    self.tokens.request(self.name, seg_id, None)
                    self._release(st, drop, hold_off=self.tokens.claim_timeout)
                elif request == "split":
                    drop(st)
                    self._persist(st)
                    keep, new = self.tokens.split(self.name, seg_id, self.owner)
                    st.segment = keep
                    st.token = st.token.for_segment(keep)
                    log.info("%s: split %s into %s and %s", self.name, seg_id, keep, new)
                elif request == "merge":
                    self._try_merge(st, status, drop)
            except (ClaimLostError, InvalidInputError) as exc:
                log.warning("%s: %s request on %s refused: %s", self.name, request, seg_id, exc)
                self.tokens.request(self.name, seg_id, None)

    def _try_merge(self, st: SegmentState, status, drop) -> None:  # type: ignore[no-untyped-def]
        sibling = st.segment.sibling()
        row = status.get(sibling.id)
        if row is None or row.segment != sibling:
            raise InvalidInputError(f"sibling {sibling} of {st.segment} is split further")
        if sibling.id not in self.claimed:
            record = self.tokens.claim(self.name, sibling.id, self.owner)
            if record is None:
                # Ask the sibling's owner to let go; merge on a later round.
                self.tokens.request(self.name, sibling.id, "release")
                return
            self._acquire(record.segment, record.token)
        other = self.claimed[sibling.id]
        for s in (st, other):
            drop(s)
            self._persist(s)
        merged = self.tokens.merge(self.name, st.segment.id, self.owner)
        self.claimed.pop(st.segment.id, None)
        self.claimed.pop(sibling.id, None)
        token = self.tokens.token(self.name, merged.id)
        assert token is not None
        self._acquire(merged, token)
        log.info("%s: merged %s and %s into %s", self.name, st.segment, sibling, merged)

    # -- pooled --------------------------------------------------------------------------------
    def _pooled_loop(self) -> None:
        proc = self.processor
        pool = ThreadPoolExecutor(
            max_workers=proc.workers or max(1, proc.segments), thread_name_prefix=f"el-{self.name}"
        )
        by_stream = proc.policy.by_stream
        policy_hash = proc.policy.routing_hash
        try:
            while not self.stopping.is_set():
                self.coordinate()
                states = [st for st in self.claimed.values() if not st.lost]
                if not states:
                    self.wakeup.wait(self.wakeup.generation, self.coordinate_interval)
                    continue
                seen = self.wakeup.generation
                segs = [(st.segment.id, st.segment.mask) for st in states] if by_stream else None
                events, upto, moved = self._read(states, segs)
                if not events and not moved:
                    for st in states:  # idle: a good moment to persist advanced tokens
                        self._persist(st)
                    self.wakeup.wait(seen)
                    continue
                shares = self._split_batch(states, events, policy_hash)
                futures = [
                    pool.submit(self.worker.process, st, evs, upto)
                    for st, evs in shares.items() if evs
                ]  # fmt: skip
                for st, evs in shares.items():
                    if not evs:
                        self.worker.idle(st, upto)
                for future in futures:
                    future.result()  # LOST and FAILED states are dropped by coordinate()
        finally:
            pool.shutdown(wait=True)
            self._shutdown()

    def _read(
        self, states: list[SegmentState], segs: list[tuple[int, int]] | None
    ) -> tuple[list[Event], int | dict[str, int], bool]:
        """The next batch for ``states``: events, how far it is complete, and whether it moves
        any token (a read past events of other segments does)."""
        proc = self.processor
        if len(self.sources) == 1:
            after = min(st.token.position for st in states)
            events, upto = self.store.read_upto(after, proc.batch_size, segs)
            return events, upto, upto > after
        afters = {
            name: min(st.token.source(name).position for st in states) for name, _ in self.sources
        }
        events, uptos = read_merged(self.sources, afters, proc.batch_size, segs, proc.order)
        return events, uptos, any(uptos[n] > afters[n] for n in uptos)

    @staticmethod
    def _split_batch(
        states: list[SegmentState], events: list[Event], policy_hash: Callable[[Event], int]
    ) -> dict[SegmentState, list[Event]]:
        """Each event to the claimed segment that owns it, unless that segment has seen it."""
        shares: dict[SegmentState, list[Event]] = {st: [] for st in states}
        by_mask: dict[int, dict[int, SegmentState]] = {}
        for st in states:
            by_mask.setdefault(st.segment.mask, {})[st.segment.id] = st
        masks = list(by_mask.items())
        for event in events:
            h = policy_hash(event)
            for mask, ids in masks:
                st = ids.get(h & mask)
                if st is not None:
                    token = st.token.source(event.source) if event.source else st.token
                    if not token.covers(event.position, h):
                        shares[st].append(event)
                    break
        return shares

    # -- tracking ------------------------------------------------------------------------------
    def _tracking_loop(self) -> None:
        try:
            while not self.stopping.is_set():
                self.coordinate(before_change=self._stop_segment_thread)
                for seg_id, st in list(self.claimed.items()):
                    thread = self._segment_threads.get(seg_id)
                    if thread is None or not thread.is_alive():
                        if st.lost:
                            self.claimed.pop(seg_id, None)
                            continue
                        thread = threading.Thread(
                            target=self._guard(lambda st=st: self._segment_loop(st)),
                            name=f"eventlanes-{self.name}-{st.segment}",
                            daemon=True,
                        )
                        self._segment_threads[seg_id] = thread
                        thread.start()
                self.stopping.wait(self.coordinate_interval)
        finally:
            for st in list(self.claimed.values()):
                self._stop_segment_thread(st)
            self._shutdown()

    def _stop_segment_thread(self, st: SegmentState) -> None:
        thread = self._segment_threads.pop(st.segment.id, None)
        if thread is not None:
            st.stop = True
            self.wakeup.notify()
            thread.join()
            st.stop = False

    def _segment_loop(self, st: SegmentState) -> None:
        proc = self.processor
        by_stream = proc.policy.by_stream
        policy_hash = proc.policy.routing_hash
        refresh_at = time.monotonic() + self.coordinate_interval
        while not self.stopping.is_set() and not st.stop and not st.lost:
            seen = self.wakeup.generation
            seg = [(st.segment.id, st.segment.mask)] if by_stream else None
            events, upto, moved = self._read([st], seg)
            mine = [
                e for e in events
                if (by_stream or st.segment.matches(policy_hash(e)))
                and not st.token.source(e.source).covers(e.position, policy_hash(e))
            ]  # fmt: skip
            if mine:
                if self.worker.process(st, mine, upto) is not Outcome.OK:
                    return
            elif moved:
                self.worker.idle(st, upto)
                if time.monotonic() - st.persisted_at > 1.0:
                    self._persist(st)
            else:
                self._persist(st)
                self.wakeup.wait(seen)
            if time.monotonic() > refresh_at:
                refresh_at = time.monotonic() + self.coordinate_interval
                parked = self._parked_keys()
                if parked is not None:
                    st.parked = {k for k, h in parked if st.segment.matches(h)}
        self._persist(st)
