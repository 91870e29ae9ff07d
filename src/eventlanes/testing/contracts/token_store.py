"""The token-store contract: what every token store backend must do, as a pytest test class.

A backend gets the whole suite by subclassing and saying how to open a store::

    class TestMyTokenStore(TokenStoreContract):
        def create_token_store(self, claim_timeout: float) -> TokenStore:
            return MyTokenStore(..., claim_timeout=claim_timeout)

Each test opens a fresh, empty store with ``create_token_store`` (once, unless it tests a
restart). Backends that keep their data across restarts also implement
``reopen_token_store``; ``close_token_store`` closes what a test opened. Needs pytest.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from ...errors import ClaimLostError, InvalidInputError
from ...segments import Segment
from ...tokens.base import DEFAULT_CLAIM_TIMEOUT
from ...tokens.token import Token
from .token_store_base import P, run_threads
from .token_store_operations import TokenStoreOperationsContract


class TokenStoreContract(TokenStoreOperationsContract):
    """Initialise, claim, extend, release, steal (fenced), split and merge (never re-deliver),
    fail and back off, requests and refusals, pause and resume, live nodes, reset tokens, and
    real threads racing for claims."""

    # how a backend is opened (create_token_store, reopen_token_store, close_token_store):
    # token_store_base.TokenStoreFixtures

    # -- initialize ----------------------------------------------------------------------------
    def test_initialize_once_with_balanced_segments(self) -> None:
        ts = self.new_store()
        assert ts.initialize(P, segments=4) is True
        assert ts.initialize(P, segments=2) is False  # exists: keeps its rows
        assert ts.segments(P) == Segment.initial(4)
        assert [s.position for s in ts.status(P)] == [0, 0, 0, 0]
        assert ts.processors() == [P]

    def test_add_segments_creates_only_the_missing_rows(self) -> None:
        """Rows added later (a Kafka topic's partitions found while running) start at their
        own positions; rows that exist keep their token and claim."""
        ts = self.new_store()
        wide = 0xFFFFFFFF
        assert ts.add_segments(P, [(Segment(0, wide), 5), (Segment(1, wide), 0)]) == [
            Segment(0, wide), Segment(1, wide)
        ]  # fmt: skip
        assert ts.claim(P, 0, "a") is not None
        ts.store(P, 0, Token(9), "a")
        created = ts.add_segments(P, [(Segment(0, wide), 0), (Segment(2, wide), 7)])
        assert created == [Segment(2, wide)]
        assert [(s.segment.id, s.position, s.owner) for s in ts.status(P)] == [
            (0, 9, "a"), (1, 0, None), (2, 7, None)
        ]  # fmt: skip
        with pytest.raises(InvalidInputError):
            ts.add_segments(P, [(Segment(3, wide), -1)])

    @pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12])
    def test_initialize_any_segment_count_as_a_balanced_tree(self, n: int) -> None:
        ts = self.new_store()
        assert ts.initialize(P, segments=n, initial=7) is True
        status = ts.status(P)
        assert [s.segment for s in status] == Segment.initial(n)
        assert [s.position for s in status] == [7] * n
        assert all(s.owner is None and not s.paused for s in status)

    def test_initial_tokens_tail_head_time_and_position(self, tmp_path: Any) -> None:
        from ...events import NewEvent
        from ...store import open_store

        ts = self.new_store()
        store = open_store(f"sqlite:///{tmp_path}/contract-events.db")
        try:
            store.append("a", [NewEvent("A"), NewEvent("B")])
            time.sleep(0.02)
            mid = datetime.now(UTC)
            time.sleep(0.02)
            store.append("b", [NewEvent("C")])
            ts.initialize("from-tail", initial="tail")
            ts.initialize("from-head", initial="head", store=store)
            ts.initialize("from-time", initial=mid, store=store)
            ts.initialize("from-future", initial=mid + timedelta(days=1), store=store)
            ts.initialize("from-pos", initial=2)
            got = {p: ts.status(p)[0].position for p in ts.processors()}
            assert got == {
                "from-tail": 0, "from-head": 3, "from-time": 2, "from-future": 3, "from-pos": 2,
            }  # fmt: skip
            with pytest.raises(InvalidInputError, match="needs the event store"):
                ts.initialize("x", initial="head")
            with pytest.raises(InvalidInputError, match="invalid initial token"):
                ts.initialize("x", initial="middle")
            with pytest.raises(InvalidInputError, match="must be >= 0"):
                ts.initialize("x", initial=-1)
            assert "x" not in ts.processors()
        finally:
            store.close()

    def test_initialize_from_many_threads_at_once_creates_once(self) -> None:
        ts = self.new_store()
        counts = [2, 3, 4, 8, 3, 6]
        barrier = threading.Barrier(len(counts))
        results: list[tuple[int, bool]] = []

        def init(n: int) -> None:
            barrier.wait()
            results.append((n, ts.initialize(P, segments=n)))

        run_threads([partial(init, n) for n in counts])
        created = [n for n, was_created in results if was_created]
        assert len(results) == len(counts) and len(created) == 1
        assert ts.segments(P) == Segment.initial(created[0])

    # -- bad input -----------------------------------------------------------------------------
    @pytest.mark.parametrize(
        "name", ["", "has space", "semi;colon", "x" * 101, "ünï", None, 5, "a/b", "x'--", "x\n"]
    )
    def test_processor_names_are_validated(self, name: Any) -> None:
        ts = self.new_store()
        for call in (
            lambda: ts.initialize(name),
            lambda: ts.claim(name, 0, "node-a"),
            lambda: ts.status(name),
            lambda: ts.pause(name),
            lambda: ts.request(name, 0, "split"),
        ):
            with pytest.raises(InvalidInputError, match="invalid processor name"):
                call()
        assert ts.processors() == []

    def test_bad_arguments_are_clear_errors_and_write_nothing(self) -> None:
        ts = self.new_store()
        for bad in (0, -1, 4097, 2.5, "3", True):
            with pytest.raises(InvalidInputError, match="from 1 to 4096"):
                ts.initialize(P, segments=bad)  # type: ignore[arg-type]
        assert ts.processors() == []
        ts.initialize(P, segments=2)
        with pytest.raises(InvalidInputError, match="owner"):
            ts.claim(P, 0, "")
        for seg in (-1, "0", 1.0, None):
            with pytest.raises(InvalidInputError, match="invalid segment id"):
                ts.claim(P, seg, "node-a")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="hold_off"):
            ts.release(P, 0, "node-a", hold_off=-1)
        with pytest.raises(InvalidInputError, match="invalid token"):
            ts.store(P, 0, -5, "node-a")
        with pytest.raises(InvalidInputError, match="claim_timeout"):
            self.new_store(claim_timeout=0)
        assert [(s.owner, s.position) for s in ts.status(P)] == [(None, 0), (None, 0)]

    # -- claims ----------------------------------------------------------------------------------
    def test_claim_extend_store_release(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        rec = ts.claim(P, 0, "node-a")
        assert rec is not None and rec.segment == Segment(0, 1) and rec.token == Token(0)
        assert rec.owner == "node-a" and rec.processor == P
        assert ts.claim(P, 0, "node-b") is None  # held
        assert ts.claim(P, 0, "node-a") is not None  # re-claim by the owner
        assert ts.claim(P, 7, "node-a") is None  # no such segment
        assert ts.claim("other", 0, "node-a") is None  # no such processor
        ts.extend(P, 0, "node-a")
        with pytest.raises(ClaimLostError, match="held by nobody"):
            ts.extend(P, 1, "node-a")
        ts.store(P, 0, Token(42), "node-a")
        ts.store(P, 0, 43, "node-a")
        assert ts.token(P, 0) == Token(43)
        assert ts.token(P, 5) is None
        status = {s.segment.id: s for s in ts.status(P)}
        assert status[0].owner == "node-a" and status[1].owner is None
        age, expires = status[0].claim_age, status[0].claim_expires_in
        assert age is not None and expires is not None
        assert 0 <= age < 5 and 5 < expires <= DEFAULT_CLAIM_TIMEOUT
        assert status[1].claim_age is None and status[1].claim_expires_in is None
        assert ts.extend_all(P, "node-a") == [0]
        assert ts.extend_all(P, "node-b") == []
        assert ts.release(P, 0, "node-b") is False
        assert ts.release(P, 0, "node-a") is True
        assert ts.release(P, 0, "node-a") is False
        claimed = ts.claim(P, 0, "node-b")
        assert claimed is not None and claimed.token == Token(43)

    def test_store_is_fenced_by_the_claim(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=1)
        with pytest.raises(ClaimLostError, match="held by nobody"):
            ts.store(P, 0, Token(5), "node-a")
        ts.claim(P, 0, "node-b")
        with pytest.raises(ClaimLostError, match="held by node-b, not node-a"):
            ts.store(P, 0, Token(5), "node-a")
        with pytest.raises(ClaimLostError, match="no segment 3"):
            ts.store(P, 3, Token(5), "node-b")
        assert ts.token(P, 0) == Token(0)

    def test_expired_claim_is_stolen_and_the_old_owner_writes_nothing(self) -> None:
        ts = self.new_store(claim_timeout=0.3)
        ts.initialize(P, segments=2)
        ts.claim(P, 0, "node-a")
        ts.claim(P, 1, "node-a")
        ts.store(P, 0, Token(4), "node-a")
        assert ts.claim(P, 0, "node-b") is None
        time.sleep(0.45)
        stolen = ts.claim(P, 0, "node-b")
        assert stolen is not None and stolen.token == Token(4)
        for write in (
            lambda: ts.store(P, 0, Token(9), "node-a"),
            lambda: ts.extend(P, 0, "node-a"),
            lambda: ts.fail(P, 0, "node-a", "late"),
            lambda: ts.split(P, 0, "node-a"),
            lambda: ts.merge(P, 1, "node-a"),
        ):
            with pytest.raises(ClaimLostError, match="held by node-b"):
                write()
        assert ts.release(P, 0, "node-a") is False
        assert ts.extend_all(P, "node-a") == [1]  # its other claim was not stolen
        [st0, st1] = ts.status(P)
        assert st0.owner == "node-b" and st0.token == Token(4) and st0.errors == 0
        assert st0.segment == Segment(0, 1) and st1.segment == Segment(1, 1)

    def test_release_with_hold_off_keeps_only_the_releaser_away(self) -> None:
        ts = self.new_store()
        ts.initialize(P)
        ts.claim(P, 0, "node-a")
        ts.release(P, 0, "node-a", hold_off=0.4)
        assert ts.claim(P, 0, "node-a") is None
        assert ts.claim(P, 0, "node-b") is not None  # others may take it at once
        ts.release(P, 0, "node-b")
        time.sleep(0.5)
        assert ts.claim(P, 0, "node-a") is not None

    def test_release_all(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=4)
        for seg in (0, 2, 3):
            ts.claim(P, seg, "node-a")
        ts.claim(P, 1, "node-b")
        assert ts.release_all(P, "node-a") == 3
        assert [s.owner for s in ts.status(P)] == [None, "node-b", None, None]

    # -- split and merge -------------------------------------------------------------------------
    def test_split_gives_both_halves_the_token_and_needs_the_claim(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        ts.claim(P, 1, "node-a")
        ts.store(P, 1, Token(30), "node-a")
        with pytest.raises(ClaimLostError, match="needs its claim"):
            ts.split(P, 0, "node-a")
        assert ts.split(P, 1, "node-a") == (Segment(1, 3), Segment(3, 3))
        st = {s.segment: s for s in ts.status(P)}
        assert set(st) == {Segment(0, 1), Segment(1, 3), Segment(3, 3)}
        assert st[Segment(1, 3)].position == st[Segment(3, 3)].position == 30
        assert st[Segment(1, 3)].owner == "node-a" and st[Segment(3, 3)].owner is None
        with pytest.raises(InvalidInputError, match="no segment 2"):
            ts.split(P, 2, "node-a")

    def test_merge_of_siblings_at_different_positions_never_redelivers(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        ts.claim(P, 0, "node-a")
        ts.claim(P, 1, "node-b")
        ts.store(P, 0, Token(100), "node-a")
        ts.store(P, 1, Token(40), "node-b")
        with pytest.raises(ClaimLostError, match="needs both claims"):
            ts.merge(P, 0, "node-a")
        assert ts.segments(P) == Segment.initial(2)  # refused: nothing changed
        ts.release(P, 1, "node-b")
        ts.claim(P, 1, "node-a")
        assert ts.merge(P, 1, "node-a") == Segment.root()
        [status] = ts.status(P)
        assert status.segment == Segment.root() and status.owner == "node-a"
        token = status.token
        # Even hashes (segment 0) saw up to 100, odd ones (segment 1) up to 40.
        assert token.position == 40 and token.high == 100
        assert token.covers(70, 0b10) and not token.covers(70, 0b11)
        assert not token.covers(101, 0b10)
        # A token read back after a restart of the claim remembers the same.
        ts.release(P, 0, "node-a")
        again = ts.claim(P, 0, "node-b")
        assert again is not None and again.token == token
        # Storing it back and splitting again restores each half's own position.
        ts.store(P, 0, again.token, "node-b")
        ts.split(P, 0, "node-b")
        assert {s.segment.id: s.position for s in ts.status(P)} == {0: 100, 1: 40}
        # Once processing passes the half that was ahead, the token is plain again.
        assert token.advance(100) == Token(100)

    def test_merge_refuses_non_siblings_and_the_root(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        for s in (0, 1):
            ts.claim(P, s, "node-a")
        ts.split(P, 1, "node-a")  # 0/1, 1/3, 3/3
        ts.claim(P, 3, "node-a")
        with pytest.raises(InvalidInputError, match="split further"):
            ts.merge(P, 0, "node-a")
        with pytest.raises(InvalidInputError, match="no segment 9"):
            ts.merge(P, 9, "node-a")
        ts.merge(P, 3, "node-a")
        ts.merge(P, 0, "node-a")
        with pytest.raises(InvalidInputError, match="root"):
            ts.merge(P, 0, "node-a")
        assert ts.segments(P) == [Segment.root()]

    def test_split_and_merge_on_an_uneven_tree(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=3)  # 0/1, 1/3, 3/3
        for seg in ts.segments(P):
            ts.claim(P, seg.id, "node-a")
        with pytest.raises(InvalidInputError, match="sibling 1/1 is split further"):
            ts.merge(P, 0, "node-a")
        assert ts.segments(P) == Segment.initial(3)
        assert ts.split(P, 0, "node-a") == (Segment(0, 3), Segment(2, 3))
        ts.claim(P, 2, "node-a")
        assert ts.merge(P, 3, "node-a") == Segment(1, 1)
        assert ts.segments(P) == [Segment(0, 3), Segment(1, 1), Segment(2, 3)]
        assert ts.merge(P, 2, "node-a") == Segment(0, 1)
        assert ts.merge(P, 0, "node-a") == Segment.root()

    # -- concurrency: real threads -------------------------------------------------------------
    def test_threads_never_hold_a_segment_together(self) -> None:
        """Each claim reads the token and stores it + 1: if two owners ever held a segment at
        once, increments would be lost and the sum would fall short."""
        ts = self.new_store()
        ts.initialize(P, segments=3)
        holders: dict[int, str] = {}
        overlaps: list[str] = []
        done: dict[str, int] = {}
        lock = threading.Lock()

        def work(owner: str) -> None:
            rng = random.Random(owner)
            count = 0
            for _ in range(15):
                seg = rng.randrange(3)
                record = ts.claim(P, seg, owner)
                if record is None:
                    continue
                with lock:
                    if seg in holders:
                        overlaps.append(f"{owner} and {holders[seg]} on {seg}")
                    holders[seg] = owner
                time.sleep(rng.random() * 0.002)
                ts.store(P, seg, record.token.position + 1, owner)
                count += 1
                with lock:
                    holders.pop(seg, None)
                assert ts.release(P, seg, owner) is True
            done[owner] = count

        run_threads([partial(work, f"node-{i}") for i in range(4)])
        assert overlaps == []
        assert len(done) == 4 and sum(done.values()) > 0
        assert sum(s.position for s in ts.status(P)) == sum(done.values())
        assert all(s.owner is None for s in ts.status(P))

    def test_threads_stealing_expired_claims_lose_no_update(self) -> None:
        """Owners that overrun their claim are stolen from; their late stores must fail, so
        every successful store is counted exactly once in the tokens."""
        ts = self.new_store(claim_timeout=0.15)
        ts.initialize(P, segments=2)
        stored: dict[str, int] = {}
        lost: dict[str, int] = {}

        def work(owner: str) -> None:
            rng = random.Random(owner)
            ok = fenced = 0
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                seg = rng.randrange(2)
                record = ts.claim(P, seg, owner)
                if record is None:
                    time.sleep(0.005)
                    continue
                time.sleep(rng.choice([0.0, 0.0, 0.3]))  # sometimes overrun the claim
                try:
                    ts.store(P, seg, record.token.position + 1, owner)
                    ok += 1
                except ClaimLostError:
                    fenced += 1
                ts.release(P, seg, owner)
            stored[owner], lost[owner] = ok, fenced

        run_threads([partial(work, f"node-{i}") for i in range(4)])
        assert len(stored) == 4
        assert sum(s.position for s in ts.status(P)) == sum(stored.values())
        assert sum(lost.values()) > 0  # steals really happened
