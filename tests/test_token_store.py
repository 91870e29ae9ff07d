"""Token store conformance: one suite for the in-memory, SQLite and PostgreSQL backends."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

import eventlanes as el
from eventlanes import Segment, Token

P = "user-state"


def test_initialize_once_with_balanced_segments(make_token_store) -> None:
    ts = make_token_store()
    assert ts.initialize(P, segments=4) is True
    assert ts.initialize(P, segments=2) is False  # exists: keeps its rows
    assert ts.segments(P) == Segment.initial(4)
    assert [s.position for s in ts.status(P)] == [0, 0, 0, 0]
    assert ts.processors() == [P]


def test_initial_tokens_tail_head_time_and_position(make_token_store, tmp_path) -> None:
    ts = make_token_store()
    store = el.open_store(f"sqlite:///{tmp_path}/events.db")
    store.append("a", [el.NewEvent("A"), el.NewEvent("B")])
    time.sleep(0.02)
    mid = datetime.now(UTC)
    time.sleep(0.02)
    store.append("b", [el.NewEvent("C")])
    ts.initialize("from-tail", initial="tail")
    ts.initialize("from-head", initial="head", store=store)
    ts.initialize("from-time", initial=mid, store=store)
    ts.initialize("from-future", initial=mid + timedelta(days=1), store=store)
    ts.initialize("from-pos", initial=2)
    got = {p: ts.status(p)[0].position for p in ts.processors()}
    assert got == {"from-tail": 0, "from-head": 3, "from-time": 2, "from-future": 3, "from-pos": 2}
    with pytest.raises(el.InvalidInputError, match="needs the event store"):
        ts.initialize("x", initial="head")
    with pytest.raises(el.InvalidInputError, match="invalid initial token"):
        ts.initialize("x", initial="middle")
    store.close()


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "x" * 101, "ünï", None])
def test_processor_names_are_validated(make_token_store, name) -> None:
    ts = make_token_store()
    with pytest.raises(el.InvalidInputError, match="invalid processor name"):
        ts.initialize(name)
    assert ts.processors() == []


def test_bad_arguments(make_token_store) -> None:
    ts = make_token_store()
    for bad in (0, -1, 4097, 2.5, "3"):
        with pytest.raises(el.InvalidInputError, match="from 1 to 4096"):
            ts.initialize(P, segments=bad)
    with pytest.raises(el.InvalidInputError, match="owner"):
        ts.claim(P, 0, "")
    with pytest.raises(el.InvalidInputError, match="claim_timeout"):
        el.InMemoryTokenStore(claim_timeout=0)
    assert ts.processors() == []


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
def test_initialize_any_segment_count_as_a_balanced_tree(make_token_store, n) -> None:
    ts = make_token_store()
    assert ts.initialize(P, segments=n) is True
    assert ts.segments(P) == Segment.initial(n)
    assert len(ts.segments(P)) == n


def test_split_and_merge_on_an_uneven_tree(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=3)  # 0/1, 1/3, 3/3
    for seg in ts.segments(P):
        ts.claim(P, seg.id, "node-a")
    with pytest.raises(el.InvalidInputError, match="sibling 1/1 is split further"):
        ts.merge(P, 0, "node-a")
    assert ts.segments(P) == Segment.initial(3)  # refused: nothing changed
    assert ts.split(P, 0, "node-a") == (Segment(0, 3), Segment(2, 3))
    ts.claim(P, 2, "node-a")
    assert ts.merge(P, 3, "node-a") == Segment(1, 1)
    assert ts.segments(P) == [Segment(0, 3), Segment(1, 1), Segment(2, 3)]
    assert ts.merge(P, 2, "node-a") == Segment(0, 1)
    assert ts.merge(P, 0, "node-a") == Segment.root()


def test_claim_extend_store_release(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=2)
    rec = ts.claim(P, 0, "node-a")
    assert rec is not None and rec.segment == Segment(0, 1) and rec.token == Token(0)
    assert ts.claim(P, 0, "node-b") is None  # held
    assert ts.claim(P, 0, "node-a") is not None  # re-claim by the owner
    assert ts.claim(P, 7, "node-a") is None  # no such segment
    ts.extend(P, 0, "node-a")
    with pytest.raises(el.ClaimLostError, match="held by nobody"):
        ts.extend(P, 1, "node-a")
    ts.store(P, 0, Token(42), "node-a")
    ts.store(P, 0, 43, "node-a")
    assert ts.token(P, 0) == Token(43)
    status = {s.segment.id: s for s in ts.status(P)}
    assert status[0].owner == "node-a" and status[1].owner is None
    assert 0 <= status[0].claim_age < 5 and 5 < status[0].claim_expires_in <= 10
    assert ts.extend_all(P, "node-a") == [0]
    assert ts.release(P, 0, "node-b") is False
    assert ts.release(P, 0, "node-a") is True
    claimed = ts.claim(P, 0, "node-b")
    assert claimed is not None and claimed.token == Token(43)


def test_store_is_fenced_by_the_claim(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=1)
    with pytest.raises(el.ClaimLostError, match="held by nobody"):
        ts.store(P, 0, Token(5), "node-a")
    ts.claim(P, 0, "node-b")
    with pytest.raises(el.ClaimLostError, match="held by node-b, not node-a"):
        ts.store(P, 0, Token(5), "node-a")
    assert ts.token(P, 0) == Token(0)


def test_expired_claim_is_stolen_and_old_owner_fails(make_token_store) -> None:
    ts = make_token_store(claim_timeout=0.3)
    ts.initialize(P)
    assert ts.claim(P, 0, "node-a")
    assert ts.claim(P, 0, "node-b") is None
    time.sleep(0.45)
    assert ts.claim(P, 0, "node-b") is not None  # stolen
    with pytest.raises(el.ClaimLostError, match="held by node-b"):
        ts.store(P, 0, Token(9), "node-a")
    assert ts.token(P, 0) == Token(0)


def test_release_with_hold_off_keeps_the_releaser_away(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P)
    ts.claim(P, 0, "node-a")
    ts.release(P, 0, "node-a", hold_off=0.4)
    assert ts.claim(P, 0, "node-a") is None
    assert ts.claim(P, 0, "node-b") is not None  # others may take it at once
    ts.release(P, 0, "node-b")
    time.sleep(0.5)
    assert ts.claim(P, 0, "node-a") is not None


def test_split_gives_both_halves_the_token_and_needs_the_claim(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=2)
    ts.claim(P, 1, "node-a")
    ts.store(P, 1, Token(30), "node-a")
    with pytest.raises(el.ClaimLostError, match="needs its claim"):
        ts.split(P, 0, "node-a")
    assert ts.split(P, 1, "node-a") == (Segment(1, 3), Segment(3, 3))
    st = {s.segment: s for s in ts.status(P)}
    assert set(st) == {Segment(0, 1), Segment(1, 3), Segment(3, 3)}
    assert st[Segment(1, 3)].position == st[Segment(3, 3)].position == 30
    assert st[Segment(1, 3)].owner == "node-a" and st[Segment(3, 3)].owner is None
    with pytest.raises(el.InvalidInputError, match="no segment 2"):
        ts.split(P, 2, "node-a")


def test_merge_of_siblings_at_different_positions_remembers_both(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=2)
    ts.claim(P, 0, "node-a")
    ts.claim(P, 1, "node-b")
    ts.store(P, 0, Token(100), "node-a")
    ts.store(P, 1, Token(40), "node-b")
    with pytest.raises(el.ClaimLostError, match="needs both claims"):
        ts.merge(P, 0, "node-a")
    ts.release(P, 1, "node-b")
    ts.claim(P, 1, "node-a")
    assert ts.merge(P, 1, "node-a") == Segment.root()
    [status] = ts.status(P)
    assert status.segment == Segment.root() and status.owner == "node-a"
    token = status.token
    assert token.position == 40 and token.covers(70, 0b0) and not token.covers(70, 0b1)
    # Storing it back and splitting again restores each half's own position.
    ts.store(P, 0, token, "node-a")
    ts.split(P, 0, "node-a")
    assert {s.segment.id: s.position for s in ts.status(P)} == {0: 100, 1: 40}


def test_merge_refuses_non_siblings_and_the_root(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P, segments=2)
    for s in (0, 1):
        ts.claim(P, s, "node-a")
    ts.split(P, 1, "node-a")  # 0/1, 1/3, 3/3
    ts.claim(P, 3, "node-a")
    with pytest.raises(el.InvalidInputError, match="split further"):
        ts.merge(P, 0, "node-a")
    ts.merge(P, 3, "node-a")
    ts.merge(P, 0, "node-a")
    with pytest.raises(el.InvalidInputError, match="root"):
        ts.merge(P, 0, "node-a")
    assert ts.segments(P) == [Segment.root()]


def test_sql_token_store_commits_with_the_callers_transaction(make_token_store) -> None:
    if make_token_store.kind == "memory":
        pytest.skip("no shared transaction in memory")
    ts = make_token_store()
    db = ts.db
    proj = db.table("projection")
    db.run_ddl([f"CREATE TABLE IF NOT EXISTS {proj} (k TEXT)"])
    ts.initialize(P)
    ts.claim(P, 0, "node-a")
    ins = db.sql(f"INSERT INTO {proj} (k) VALUES (?)")
    with db.transaction() as conn:
        conn.execute(ins, ("one",))
        ts.store(P, 0, Token(1), "node-a", conn=conn)
    # A lost claim fails the token write, and the projection write rolls back with it.
    ts.release(P, 0, "node-a")
    ts.claim(P, 0, "node-b")
    with pytest.raises(el.ClaimLostError), db.transaction() as conn:
        conn.execute(ins, ("two",))
        ts.store(P, 0, Token(2), "node-a", conn=conn)
    assert db.query(f"SELECT k FROM {proj}") == [("one",)]
    assert ts.token(P, 0) == Token(1)


def test_failures_back_off_for_every_node_and_success_clears_them(make_token_store) -> None:
    ts = make_token_store()
    ts.initialize(P)
    ts.claim(P, 0, "node-a")
    assert ts.fail(P, 0, "node-a", "boom") == 1.0  # released, 1 s back-off
    [st] = ts.status(P)
    assert st.owner is None and st.errors == 1 and st.last_error == "boom"
    assert 0 < st.retry_in <= 1.0
    assert ts.claim(P, 0, "node-b") is None  # nobody retries before the back-off
    assert ts.claim(P, 0, "reset", ignore_backoff=True) is not None
    assert ts.fail(P, 0, "reset", "boom again") == 2.0  # doubles
    time.sleep(2.1)
    assert ts.claim(P, 0, "node-b") is not None
    ts.store(P, 0, Token(3), "node-b")
    [st] = ts.status(P)
    assert st.errors == 0 and st.last_error is None and st.retry_in is None
    with pytest.raises(el.ClaimLostError):
        ts.fail(P, 0, "node-a", "not mine")


def test_requests_and_node_heartbeats(make_token_store) -> None:
    ts = make_token_store(claim_timeout=0.5)
    ts.initialize(P, segments=2)
    assert ts.request(P, 1, "split") is True
    assert ts.status(P)[1].request == "split"
    assert ts.request(P, 1, None) is True and ts.status(P)[1].request is None
    assert ts.request(P, 9, "merge") is False
    with pytest.raises(el.InvalidInputError, match="unknown request"):
        ts.request(P, 1, "explode")
    ts.heartbeat(P, "node-a")
    ts.heartbeat(P, "node-b")
    assert ts.live_nodes(P) == ["node-a", "node-b"]
    ts.leave(P, "node-a")
    assert ts.live_nodes(P) == ["node-b"]
    time.sleep(0.6)
    assert ts.live_nodes(P) == []  # silent longer than the claim timeout: not live
