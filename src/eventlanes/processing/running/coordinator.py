"""Which segments this process holds: claims and fair share, static assignment, and the
split / merge / release requests other nodes leave in the token store.

Only the thread that processes the segments calls :meth:`Coordinator.coordinate`, between
batches, so a segment never changes under a batch in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...db.weather import Outage
from ...errors import CorruptTokenError, InvalidInputError
from ...observe import Observer
from ...segments import Segment
from ...store.read_wait import ReadWaitWatch
from ...tokens import SegmentStatus, Token, TokenRecord, TokenStore
from ...tokens.claims import HOLD_OFF_ROUNDS, claimable, fair_share, gives_way
from ..processor import Processor
from ..segment import Progress, SegmentState
from ..tables.dead_letters import DeadLetterStore
from .requests import Drop, Persist, carry_out

log = logging.getLogger("eventlanes.processing")


def _nothing(st: SegmentState) -> None:
    return None


class Coordinator:
    """Holds ``proc``'s segments for ``owner``. Its parts: the token store, the dead letters
    (parked keys), the observer, the process's commit ``progress`` (each claimed segment
    tells it of its commits), the ``read_waits`` watch (checked at each heartbeat), and two
    calls of the executor: ``persist`` (store a segment's token, and what is held for it,
    before the segment changes or goes) and ``record_crash`` (record an exception that stops
    the runner as a segment's failure)."""

    def __init__(
        self,
        proc: Processor,
        owner: str,
        *,
        tokens: TokenStore,
        dead_letters: DeadLetterStore,
        observer: Observer,
        progress: Progress,
        read_waits: ReadWaitWatch,
        persist: Persist,
        record_crash: Callable[[SegmentState, BaseException], None],
        static: tuple[int, int] | None = None,
        interval: float,
    ) -> None:
        if static is not None:
            index, nodes = static
            if not (isinstance(nodes, int) and nodes >= 1 and 0 <= index < nodes):
                raise InvalidInputError(f"static mode needs 0 <= node index < nodes, got {static}")
        self.proc = proc
        self.name = proc.name
        self.tokens = tokens
        self.dead_letters = dead_letters
        self.observer = observer
        self.progress = progress
        self.read_waits = read_waits
        self.persist = persist
        self.record_crash = record_crash
        self.owner = owner
        self.static = static
        self.interval = interval
        self.claimed: dict[int, SegmentState] = {}
        self.lock = threading.Lock()  # guards ``claimed`` and ``failing`` (the heartbeat's)
        #: segments given up as stuck whose failure the heartbeat is still writing: claiming
        #: one before that write lands would let the write release the new attempt's claim
        self.failing: set[int] = set()
        self._next = 0.0
        self.outage = Outage(proc.name)  # database outages, logged once at start and end

    # -- what the heartbeat learns -------------------------------------------------------------
    def held(self, held: set[int], since: float) -> None:
        """Segments whose claim could not be extended are lost: nothing of theirs commits;
        not one claimed after the extension began (``since``, monotonic), which the extension
        may not have seen: the next one judges it (a segment claimed again for its retry was
        lost at once, and its failure went unrecorded: no back-off).
        A segment whose handler has run past ``handler_timeout`` is given up the same way and
        recorded as failed (retried with back-off, on any node); its transaction rolls back."""
        self.read_waits.check()  # at most every few seconds: a warning if due
        now = time.monotonic()
        timeout = self.proc.handler_timeout
        stuck = []
        if not held and self.claimed and self.tokens.is_paused(self.name):
            return  # paused: the next round stores the tokens and lets every segment go
        with self.lock:
            for seg_id, st in self.claimed.items():
                if seg_id not in held:
                    if st.claimed_at < since:
                        st.mark_lost()
                elif not st.lost and st.stuck_for(now) > timeout:
                    st.mark_lost()  # first: its batch must not commit once we let go
                    self.failing.add(seg_id)
                    stuck.append((seg_id, st))
        try:
            for _, st in stuck:
                self._give_up(st, now, timeout)
        finally:  # all of them, also when one raised (an observer's call, say)
            with self.lock:
                self.failing.difference_update(seg_id for seg_id, _ in stuck)

    def _give_up(self, st: SegmentState, now: float, timeout: float) -> None:
        text = (
            f"handler did not finish within {timeout:g} s (handler_timeout): stuck for "
            f"{st.stuck_for(now):.0f} s at {st.describe_running()}"
        )
        self.observer.failed(self.name, str(st.segment), text)
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
        self._let_go_unheld(status)
        self._notify_claims()
        return True

    def _let_go_unheld(self, status: dict[int, SegmentStatus]) -> None:
        """Release every claim the token store records as ours that this node does not hold (a
        claim whose answer was lost as the database restarted): the heartbeat extends all of
        our claims, so such a claim would never expire, and no node would handle its
        segment. Rows this round released or merged away look so in ``status`` too: the
        candidates are read again (rarely any)."""
        if not any(r.owner == self.owner and i not in self.claimed for i, r in status.items()):
            return
        for row in self.tokens.status(self.name):
            seg_id = row.segment.id
            if row.owner == self.owner and seg_id not in self.claimed:
                log.warning("%s: letting go of %s, claimed for this node but not held by it",
                            self.name, row.segment)  # fmt: skip
                self.tokens.release(self.name, seg_id, self.owner, hold_off=0.0)

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
            limit, surplus = fair_share(len(status), len(live), self.proc.max_segments,
                                        self.claimed)  # fmt: skip
            hold_off = self.interval * HOLD_OFF_ROUNDS
            for seg_id in surplus:  # give the surplus to nodes that are waiting
                self.release(self.claimed[seg_id], drop, hold_off=hold_off)
            if gives_way(status.values(), live, self.owner, len(self.claimed)):
                st = self.claimed[max(self.claimed)]
                log.info("%s: releasing %s for a node with less than its share", self.name,
                         st.segment)  # fmt: skip
                self.release(st, drop, hold_off=hold_off)
            if len(self.claimed) >= limit:
                wanted = []
        for seg_id in wanted:
            if seg_id in self.claimed:
                continue
            if limit is not None and len(self.claimed) >= limit:
                break
            if not claimable(status[seg_id], self.owner):
                continue
            try:
                record = self.claim(seg_id)
            except CorruptTokenError as exc:  # recorded on its row, retried with back-off
                log.error("%s: %s; segment stopped, retried with back-off", self.name, exc)
                self.observer.failed(self.name, exc.segment, str(exc))
                continue
            if record is not None:
                self.acquire(record.segment, record.token)

    def claim(self, seg_id: int) -> TokenRecord | None:
        """Claim ``seg_id`` in the token store, unless the heartbeat is still recording it as
        given up (None: a later round claims it, once the failure's back-off allows)."""
        with self.lock:
            if seg_id in self.failing:
                return None
        return self.tokens.claim(self.name, seg_id, self.owner)

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
        self.observer.claims(self.name, len(self.claimed))

    # -- holding and letting go ----------------------------------------------------------------
    def acquire(self, segment: Segment, token: Token) -> SegmentState:
        st = SegmentState(segment, token, progress=self.progress)
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
        self.persist(st)
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
                self.persist(st)
            except Exception:  # noqa: BLE001 - its last stored token stays: nothing is lost
                log.warning("%s %s: storing the token failed", self.name, st.segment)
            self.record_crash(st, exc)

    def release_all(self) -> None:
        """On shutdown, after the last batch: persist tokens, release, leave. A database that is
        down does not stop the shutdown: unreleased claims expire by themselves."""
        try:
            for seg_id, st in list(self.claimed.items()):
                self.persist(st)
                self.tokens.release(self.name, seg_id, self.owner)
            self.tokens.leave(self.name, self.owner)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: could not release claims on shutdown (%s); they expire", self.name,
                        exc)  # fmt: skip
        with self.lock:
            self.claimed.clear()
