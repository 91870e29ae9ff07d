"""The token-store contract, operations: failures and back-off, requests and refusals, pause
and resume, live nodes, reset tokens and versions (part of ``token_store.TokenStoreContract``)."""

from __future__ import annotations

import time

import pytest

from ...errors import ClaimLostError, InvalidInputError, ProcessorPausedError
from ...segments import Segment
from ...tokens.token import Token
from .token_store_base import P, TokenStoreFixtures


class TokenStoreOperationsContract(TokenStoreFixtures):
    """What operations ask of a token store."""

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
