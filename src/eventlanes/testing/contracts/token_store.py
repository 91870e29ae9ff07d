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
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from ...errors import ClaimLostError, InvalidInputError, ProcessorPausedError
from ...segments import Segment
from ...tokens import TokenStore
from ...tokens.base import DEFAULT_CLAIM_TIMEOUT
from ...tokens.token import Token

P = "contract"


class TokenStoreContract(ABC):
    """Initialise, claim, extend, release, steal (fenced), split and merge (never re-deliver),
    fail and back off, requests and refusals, pause and resume, live nodes, reset tokens, and
    real threads racing for claims."""

    # -- how a backend is opened: subclasses implement ------------------------------------------
    @abstractmethod
    def create_token_store(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> TokenStore:
        """A token store on fresh, empty storage for the current test."""

    def reopen_token_store(self, store: TokenStore) -> TokenStore | None:
        """The same storage opened again, as after a restart; None if nothing survives one."""
        return None

    def close_token_store(self, store: TokenStore) -> None:
        store.close()

    # -- plumbing ----------------------------------------------------------------------------------
    @pytest.fixture(autouse=True)
    def _close_opened_stores(self) -> Iterator[None]:
        self._opened: list[TokenStore] = []
        yield
        for store in reversed(self._opened):
            self.close_token_store(store)

    def new_store(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> TokenStore:
        store = self.create_token_store(claim_timeout)
        self._opened.append(store)
        return store

    def reopen(self, store: TokenStore) -> TokenStore:
        again = self.reopen_token_store(store)
        if again is None:
            pytest.skip(f"{type(store).__name__} keeps nothing across restarts")
        self._opened.append(again)
        return again

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

        _run_threads([partial(init, n) for n in counts])
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

    # -- failures --------------------------------------------------------------------------------
    def test_failures_back_off_for_every_node_and_success_clears_them(self) -> None:
        ts = self.new_store()
        ts.initialize(P)
        ts.claim(P, 0, "node-a")
        assert ts.fail(P, 0, "node-a", "boom") == 1.0  # released, 1 s back-off
        [st] = ts.status(P)
        assert st.owner is None and st.errors == 1 and st.last_error == "boom"
        assert st.retry_in is not None and 0 < st.retry_in <= 1.0
        assert ts.claim(P, 0, "node-b") is None  # nobody retries before the back-off
        assert ts.claim(P, 0, "node-a") is None
        assert ts.claim(P, 0, "reset", ignore_backoff=True) is not None
        assert ts.fail(P, 0, "reset", "boom again") == 2.0  # doubles
        assert ts.status(P)[0].errors == 2
        time.sleep(2.1)
        assert ts.claim(P, 0, "node-b") is not None
        ts.store(P, 0, Token(3), "node-b")
        [st] = ts.status(P)
        assert st.errors == 0 and st.last_error is None and st.retry_in is None
        with pytest.raises(ClaimLostError):
            ts.fail(P, 0, "node-a", "not mine")
        assert ts.status(P)[0].errors == 0

    # -- requests and refusals ---------------------------------------------------------------------
    def test_requests_reach_the_owner(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        assert ts.request(P, 1, "split") is True
        assert [s.request for s in ts.status(P)] == [None, "split"]
        assert ts.request(P, 1, None) is True and ts.status(P)[1].request is None
        assert ts.request(P, 9, "merge") is False
        assert ts.request("nobody", 0, "merge") is False
        with pytest.raises(InvalidInputError, match="unknown request"):
            ts.request(P, 1, "explode")
        ts.request(P, 1, "split")
        ts.claim(P, 1, "node-a")
        ts.split(P, 1, "node-a")  # carrying a request out clears it
        assert all(s.request is None for s in ts.status(P))

    def test_refusals_tell_the_asker_why_at_once(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        assert ts.refuse(P, 0, "nothing asked") is False  # no request pending
        assert ts.status(P)[0].request_refused is None
        ts.request(P, 0, "merge")
        assert ts.refuse(P, 0, "sibling 1/1 is split further", what="split") is False
        assert ts.status(P)[0].request == "merge"  # a different request stays
        assert ts.refuse(P, 0, "sibling 1/1 is split further", what="merge") is True
        st = ts.status(P)[0]
        assert st.request is None and st.request_refused == "sibling 1/1 is split further"
        assert ts.status(P)[1].request_refused is None
        ts.request(P, 0, None)  # withdrawing keeps the reason for whoever is waiting
        assert ts.status(P)[0].request_refused == "sibling 1/1 is split further"
        ts.request(P, 0, "split")  # a new request clears it
        st = ts.status(P)[0]
        assert st.request == "split" and st.request_refused is None
        assert ts.refuse(P, 0, "x" * 10_000) is True
        refused = ts.status(P)[0].request_refused
        assert refused is not None and 0 < len(refused) <= 4000
        assert ts.refuse(P, 7, "no such segment") is False
        for bad in ("", "   ", None):
            with pytest.raises(InvalidInputError, match="needs a reason"):
                ts.refuse(P, 0, bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="unknown request"):
            ts.refuse(P, 0, "why", what="explode")

    # -- status ----------------------------------------------------------------------------------
    def test_status_of_an_unknown_processor_is_empty_and_creates_nothing(self) -> None:
        ts = self.new_store()
        assert ts.status(P) == [] and ts.segments(P) == [] and ts.token(P, 0) is None
        assert ts.is_paused(P) is False and ts.live_nodes(P) == []
        assert ts.processors() == []
        # Reading did not fix the initial position: the first initialize decides it.
        assert ts.initialize(P, segments=3, initial=12) is True
        assert [s.position for s in ts.status(P)] == [12, 12, 12]

    # -- pause and resume ------------------------------------------------------------------------
    def test_pause_stops_every_claim_until_resumed(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=3)
        ts.initialize("other", segments=1)
        ts.claim(P, 0, "node-a")
        assert ts.pause(P) is True
        assert ts.pause(P) is False  # already paused
        assert ts.is_paused(P) is True and ts.is_paused("other") is False
        assert ts.claim(P, 0, "node-a") is None  # not even the owner's re-claim
        assert ts.claim(P, 1, "node-b") is None
        assert ts.claim("other", 0, "node-b") is not None  # other processors carry on
        assert ts.extend_all(P, "node-a") == []  # owners see they must let go
        with pytest.raises(ProcessorPausedError, match="paused"):
            ts.extend(P, 0, "node-a")
        assert all(s.paused for s in ts.status(P))
        assert not any(s.paused for s in ts.status("other"))
        # The owner still persists its work, then lets go.
        ts.store(P, 0, Token(8), "node-a")
        assert ts.release_all(P, "node-a") == 1
        assert all(s.owner is None for s in ts.status(P))
        # Admin work on a paused processor (a reset) may claim it explicitly.
        admin = ts.claim(P, 3, "reset", ignore_pause=True)
        assert admin is not None and admin.token == Token(0)
        ts.release(P, 3, "reset")
        assert ts.resume(P) is True
        assert ts.resume(P) is False
        assert ts.is_paused(P) is False and not any(s.paused for s in ts.status(P))
        claimed = ts.claim(P, 0, "node-b")
        assert claimed is not None and claimed.token == Token(8)
        assert ts.extend_all(P, "node-b") == [0]

    def test_pause_before_the_processor_exists(self) -> None:
        ts = self.new_store()
        assert ts.pause(P) is True
        assert ts.status(P) == [] and ts.processors() == []  # pausing creates no token rows
        assert ts.initialize(P, segments=2) is True
        assert all(s.paused for s in ts.status(P))
        assert ts.claim(P, 0, "node-a") is None
        ts.resume(P)
        assert ts.claim(P, 0, "node-a") is not None

    def test_pause_survives_a_restart(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        ts.pause(P)
        ts.pause("not-yet")
        again = self.reopen(ts)
        assert again.is_paused(P) and again.is_paused("not-yet")
        assert again.claim(P, 0, "node-a") is None
        again.resume(P)
        assert again.claim(P, 0, "node-a") is not None
        assert ts.is_paused(P) is False  # one storage, seen by every store open on it

    # -- nodes -------------------------------------------------------------------------------------
    def test_live_nodes_and_heartbeats(self) -> None:
        ts = self.new_store(claim_timeout=0.5)
        ts.initialize(P, segments=2)
        ts.heartbeat(P, "node-a")
        ts.heartbeat(P, "node-b")
        ts.heartbeat("other", "node-c")
        assert ts.live_nodes(P) == ["node-a", "node-b"]
        ts.leave(P, "node-a")
        assert ts.live_nodes(P) == ["node-b"]
        time.sleep(0.3)
        ts.heartbeat(P, "node-b")
        time.sleep(0.3)
        assert ts.live_nodes(P) == ["node-b"]  # its heartbeat kept it alive
        time.sleep(0.3)
        assert ts.live_nodes(P) == []  # silent longer than the claim timeout: not live

    # -- reset and rich tokens -------------------------------------------------------------------
    def test_reset_and_merged_tokens_are_stored_whole(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        ts.claim(P, 0, "reset")
        ts.claim(P, 1, "reset")
        ts.store(P, 0, Token(50), "reset")
        before = ts.status(P)[0].token
        replay = Token.reset(before, 10, {"reason": "handler fixed", "n": [1, 2]})
        assert replay.is_replay(50) and not replay.is_replay(51)
        merged = Token.merged(
            Segment(0, 3), Token.reset(Token(40), 30), Segment(2, 3), Token.reset(Token(40), 20)
        ).with_source("orders", Token(7, ((1, 1, 9),)))
        # Halves replaying to different ends (one not at all): a replay end per part.
        apart = Token.merged(
            Segment(1, 3), Token.reset(Token(40), 30, "why"), Segment(3, 3), Token(20)
        )
        assert apart.is_replay(35, 0b01) and not apart.is_replay(35, 0b11)
        ts.store(P, 0, replay, "reset")
        ts.store(P, 1, apart, "reset")
        ts.release_all(P, "reset")
        got = {s.segment.id: s.token for s in ts.status(P)}
        assert got == {0: replay, 1: apart}
        assert got[1].replay_context == "why" and got[1].replays == ((1, 3, 40),)
        ts.claim(P, 1, "reset")
        ts.store(P, 1, merged, "reset")
        ts.release(P, 1, "reset")
        assert ts.token(P, 1) == merged
        record = ts.claim(P, 0, "node-a")
        assert record is not None and record.token == replay
        assert record.token.replay_context == {"reason": "handler fixed", "n": [1, 2]}
        # Past the replayed range, the token is plain again.
        ts.store(P, 0, record.token.advance(60), "node-a")
        assert ts.token(P, 0) == Token(60)

    # -- versions of a processor ------------------------------------------------------------
    def test_a_version_starts_once_with_what_earlier_versions_had_handled(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        for seg_id, position in ((0, 30), (1, 60)):
            ts.claim(P, seg_id, "n1")
            ts.store(P, seg_id, Token(position), "n1")
        v2 = f"{P}@v2"
        assert ts.initialize(v2, segments=1, after=[P], context={"version": 2}) is True
        start = ts.token(v2, 0)
        assert start is not None and start.position == 0
        assert start.is_replay(30, 0b10) and not start.is_replay(31, 0b10)
        assert start.is_replay(60, 0b11) and not start.is_replay(61, 0b11)
        assert start.replay_context == {"version": 2}
        ts.store(P, 0, Token(90), "n1")  # later progress of version 1 changes nothing
        assert ts.initialize(v2, segments=4, after=[P]) is False and ts.token(v2, 0) == start
        # A third version: the union of both earlier ones (those without rows count nothing).
        ts.claim(v2, 0, "n2")
        ts.store(v2, 0, start.advance(75), "n2")
        assert ts.initialize(f"{P}@v3", segments=2, after=[P, v2, f"{P}@v9"]) is True
        assert [s.token.replays for s in ts.status(f"{P}@v3")] == [((0, 0, 90),), ((0, 0, 75),)]
        assert [(r.processor, r.version) for r in ts.versions(P)] == [(v2, 2), (f"{P}@v3", 3)]
        assert all(r.started_at and r.promoted_at is None for r in ts.versions(P))

    def test_promote_records_the_version_readers_see(self) -> None:
        ts = self.new_store()
        ts.promote(f"{P}@v2")
        first = {r.processor: r for r in ts.versions(P)}[f"{P}@v2"]
        assert first.version == 2 and first.promoted_at is not None
        ts.promote(P)  # version 1 gets a row when promoted back
        assert {r.version for r in ts.versions(P) if r.promoted_at} == {1, 2}

    def test_retire_is_fenced_and_leaves_a_marker_nothing_claims(self) -> None:
        ts = self.new_store()
        ts.initialize(P, segments=2)
        ts.claim(P, 0, "admin")
        ts.store(P, 0, Token(20), "admin")
        with pytest.raises(ClaimLostError, match="needs every claim"):
            ts.retire(P, "admin")  # segment 1 not held
        ts.claim(P, 1, "admin")
        ts.store(P, 1, Token(12), "admin")
        ts.heartbeat(P, "admin")
        ts.pause(P)
        assert ts.retire(P, "admin") == 2
        assert ts.retired(P) and ts.live_nodes(P) == [] and not ts.is_paused(P)
        [marker] = ts.status(P)
        assert marker.segment == Segment.root() and marker.position == 12
        assert ts.claim(P, 0, "node-x") is None  # no node of any release runs it again
        assert ts.claim(P, 0, "node-x", ignore_backoff=True, ignore_pause=True) is None
        assert ts.initialize(P, segments=4) is False  # its rows exist: nothing starts over
        [record] = ts.versions(P)
        assert record.version == 1 and record.retired_at is not None
        with pytest.raises(InvalidInputError, match="retired already"):
            ts.retire(P, "admin")
        with pytest.raises(InvalidInputError, match="no token rows"):
            ts.retire("never-ran", "admin")

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

        _run_threads([partial(work, f"node-{i}") for i in range(4)])
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

        _run_threads([partial(work, f"node-{i}") for i in range(4)])
        assert len(stored) == 4
        assert sum(s.position for s in ts.status(P)) == sum(stored.values())
        assert sum(lost.values()) > 0  # steals really happened


def _run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> None:
    """Run targets on real threads at once; re-raise the first failure."""
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
