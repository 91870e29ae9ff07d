"""Which segments this process holds: claims and fair share, static assignment, and the
split / merge / release requests other nodes leave in the token store.

Only the thread that processes the segments calls :meth:`Coordinator.coordinate`, between
batches, so a segment never changes under a batch in flight.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter

from ...db.weather import Outage
from ...errors import InvalidInputError
from ...segments import Segment
from ...tokens import SegmentStatus, Token
from ..executors.exactly_once import SegmentWorker
from ..processor import Processor
from ..segment import SegmentState
from ..tables.dead_letters import DeadLetterStore
from .requests import Drop, carry_out

log = logging.getLogger("eventlanes.processing")


def _nothing(st: SegmentState) -> None:
    return None


class Coordinator:
    def __init__(
        self,
        proc: Processor,
        worker: SegmentWorker,
        dead_letters: DeadLetterStore,
        owner: str,
        static: tuple[int, int] | None,
        interval: float,
    ) -> None:
        if static is not None:
            index, nodes = static
            if not (isinstance(nodes, int) and nodes >= 1 and 0 <= index < nodes):
                raise InvalidInputError(f"static mode needs 0 <= node index < nodes, got {static}")
        self.proc = proc
        self.name = proc.name
        self.worker = worker
        self.tokens = worker.tokens
        self.dead_letters = dead_letters
        self.owner = owner
        self.static = static
        self.interval = interval
        self.claimed: dict[int, SegmentState] = {}
        self.lock = threading.Lock()  # guards ``claimed`` against the heartbeat's reads
        self._next = 0.0
        self.outage = Outage(proc.name)  # database outages, logged once at start and end

    # -- what the heartbeat learns -------------------------------------------------------------
    def held(self, held: set[int]) -> None:
        """Segments whose claim could not be extended are lost: nothing of theirs commits.
        A segment whose handler has run past ``handler_timeout`` is given up the same way and
        recorded as failed (retried with back-off, on any node); its transaction rolls back."""
        self.worker.runtime.read_waits.check()  # at most every few seconds: a warning if due
        now = time.monotonic()
        timeout = self.proc.handler_timeout
        stuck = []
        if not held and self.claimed and self.tokens.is_paused(self.name):
            return  # paused: the next round stores the tokens and lets every segment go
        with self.lock:
            for seg_id, st in self.claimed.items():
                if seg_id not in held:
                    st.mark_lost()
                elif not st.lost and st.stuck_for(now) > timeout:
                    st.mark_lost()  # first: its batch must not commit once we let go
                    stuck.append(st)
        for st in stuck:
            text = (
                f"handler did not finish within {timeout:g} s (handler_timeout): stuck for "
                f"{st.stuck_for(now):.0f} s at {st.describe_running()}"
            )
            self.worker.observer.failed(self.name, str(st.segment), text)
            try:
                delay = self.tokens.fail(self.name, st.segment.id, self.owner, text)
                log.error("%s %s: %s; released, retrying in %.0f s", self.name, st.segment,
                          text, delay)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - the claim expires by itself
                log.error("%s %s: %s; recording it failed: %s", self.name, st.segment, text, exc)

    def force_next(self) -> None:
        """The next ``coordinate`` runs at once (after a database outage, say)."""
        self._next = 0.0

    # -- one round -----------------------------------------------------------------------------
    def coordinate(self, drop: Drop = _nothing, force: bool = False) -> bool:
        """Claim, release, split and merge (at most every ``interval`` seconds); ``drop(st)``
        is called before a held segment changes or goes (tracking mode stops its thread)."""
        now = time.monotonic()
        if now < self._next and not force:
            return False
        self._next = now + self.interval
        rows = self.tokens.status(self.name)
        status = {s.segment.id: s for s in rows}
        if any(s.paused for s in rows):
            self._let_go(drop, "paused")
            return True
        for seg_id, st in list(self.claimed.items()):
            row = status.get(seg_id)
            if st.lost or row is None or row.owner != self.owner or row.segment != st.segment:
                drop(st)
                self.forget(seg_id)
        carry_out(self, status, drop)
        self._claim(status, drop)
        self._notify_claims()
        return True

    def _claim(self, status: dict[int, SegmentStatus], drop: Drop) -> None:
        limit: int | None = None  # static mode takes its fixed segments, no fair-share cap
        if self.static is not None:
            index, nodes = self.static
            ids = sorted(status)
            wanted = [ids[i] for i in range(index, len(ids), nodes)]
            for seg_id in list(self.claimed):
                if seg_id not in wanted:
                    self.release(self.claimed[seg_id], drop, hold_off=0.0)
        else:
            wanted = sorted(status)
            live = self.tokens.live_nodes(self.name)
            limit = self._limit(len(status), len(live))
            while len(self.claimed) > limit:  # give the surplus to nodes that are waiting
                surplus = self.claimed[max(self.claimed)]
                self.release(surplus, drop, hold_off=self.interval * 3)
            if self._gives_way(status, live):
                surplus = self.claimed[max(self.claimed)]
                log.info("%s: releasing %s for a node with less than its share", self.name,
                         surplus.segment)  # fmt: skip
                self.release(surplus, drop, hold_off=self.interval * 3)
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
                self.acquire(record.segment, record.token)

    def _limit(self, total: int, live: int) -> int:
        """How many segments this node may hold: its fair share among live nodes."""
        fair = math.ceil(total / max(1, live))
        if self.proc.max_segments is not None:
            fair = min(fair, self.proc.max_segments)
        return fair

    def _gives_way(self, status: dict[int, SegmentStatus], live: list[str]) -> bool:
        """Whether this node lets one of its segments go for a live node that holds less than
        the floor of the fair share while every segment is held: the cap alone (the ceiling)
        lets two nodes hold 2 + 2 of 4 segments and a third none, for as long as they run.
        Only the node holding the most gives (ties: the name that sorts first), one segment
        at a time."""
        if len(live) < 2:
            return False
        floor = len(status) // len(live)
        if len(self.claimed) <= floor:
            return False
        held: Counter[str] = Counter()
        for row in status.values():
            if row.owner is None or (row.claim_expires_in or 0) <= 0:
                return False  # one is free: the node short of its share takes that one
            held[row.owner] += 1
        if all(held[node] >= floor for node in live):
            return False
        return min([*live, self.owner], key=lambda node: (-held[node], node)) == self.owner

    def parked_keys(self) -> list[tuple[str, int]] | None:
        """Keys with parked events (dead-letter mode). Read on the thread that processes the
        segments, between batches, so a key it just parked is always in the table already."""
        if self.proc.on_error != "dead_letter":
            return None
        return self.dead_letters.parked_keys(self.name)

    def refresh_parked(self, states: list[SegmentState]) -> None:
        parked = self.parked_keys()
        if parked is None:
            return
        for st in states:
            st.parked = {k for k, h in parked if st.segment.matches(h)}

    def _notify_claims(self) -> None:
        self.worker.observer.claims(self.name, len(self.claimed))

    # -- holding and letting go ----------------------------------------------------------------
    def acquire(self, segment: Segment, token: Token) -> SegmentState:
        st = SegmentState(segment, token, progress=self.worker.runtime.progress)
        self.refresh_parked([st])
        with self.lock:
            self.claimed[segment.id] = st
        log.info("%s: %s claimed %s at %s", self.name, self.owner, segment, token)
        return st

    def forget(self, seg_id: int) -> None:
        with self.lock:
            self.claimed.pop(seg_id, None)

    def release(self, st: SegmentState, drop: Drop, hold_off: float) -> None:
        drop(st)
        self.worker.persist(st)
        self.tokens.release(self.name, st.segment.id, self.owner, hold_off=hold_off)
        self.forget(st.segment.id)

    def _let_go(self, drop: Drop, why: str) -> None:
        """Store every held segment's token and release it (the processor is paused)."""
        for st in list(self.claimed.values()):
            log.info("%s: releasing %s (%s)", self.name, st.segment, why)
            self.release(st, drop, hold_off=0.0)
        self._notify_claims()

    def crashed(self, exc: BaseException) -> None:
        """The runner is stopped by ``exc``. Unless a segment's batch raised it (and recorded
        it), it is recorded on every held segment, so that ``status`` shows the crash; they
        are let go with a back-off (their tokens stored first), like failed batches."""
        with self.lock:
            held = list(self.claimed.values())
        if any(st.crashed for st in held):
            return
        for st in held:
            if st.lost:
                continue
            try:
                self.worker.persist(st)
            except Exception:  # noqa: BLE001 - its last stored token stays: nothing is lost
                log.warning("%s %s: storing the token failed", self.name, st.segment)
            self.worker.crashed(st, exc)

    def release_all(self) -> None:
        """On shutdown, after the last batch: persist tokens, release, leave. A database that is
        down does not stop the shutdown: unreleased claims expire by themselves."""
        try:
            for seg_id, st in list(self.claimed.items()):
                self.worker.persist(st)
                self.tokens.release(self.name, seg_id, self.owner)
            self.tokens.leave(self.name, self.owner)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: could not release claims on shutdown (%s); they expire", self.name,
                        exc)  # fmt: skip
        with self.lock:
            self.claimed.clear()
