"""Token store under real concurrency: processes racing for claims, steals, splits, inits."""

from __future__ import annotations

import multiprocessing as mp
import random
import time

import pytest

import eventlanes as el
from eventlanes import Segment, Token

P = "racer"
PROCS = 8


@pytest.fixture
def ts_url(store_url: str) -> str:
    """A fresh database on each SQL backend (processes need a shared database)."""
    el.open_token_store(store_url).db.close()  # creates the schema
    return store_url


def _claim_everything(url: str, owner: str, barrier, out) -> None:
    ts = el.open_token_store(url)
    barrier.wait()
    won = [s for s in range(8) if ts.claim(P, s, owner) is not None]
    out.put((owner, won))


def _start(target, args_list):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(args_list))
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out)) for a in args_list]
    for p in procs:
        p.start()
    # The barrier travels with the procs: a spawned child rebuilds it from its name, which
    # must outlive the parent's reference.
    procs[0].barrier = barrier  # type: ignore[attr-defined]
    return procs, out


def _finish(procs, out, n):
    results = [out.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


def test_processes_racing_for_claims_each_segment_has_one_winner(ts_url) -> None:
    ts = el.open_token_store(ts_url)
    ts.initialize(P, segments=8)
    procs, out = _start(_claim_everything, [(ts_url, f"node-{i}") for i in range(PROCS)])
    results = _finish(procs, out, PROCS)
    winners: dict[int, list[str]] = {}
    for owner, won in results:
        for s in won:
            winners.setdefault(s, []).append(owner)
    assert sorted(winners) == list(range(8))
    assert all(len(w) == 1 for w in winners.values()), winners
    assert {s.segment.id: s.owner for s in ts.status(P)} == {s: w[0] for s, w in winners.items()}


def _slow_owner(url: str, proj: str, in_tx: bool, barrier, out) -> None:
    ts = el.open_token_store(url, claim_timeout=0.5)
    ts.claim(P, 0, "slow")
    db = ts.db
    barrier.wait()
    try:
        if not in_tx:
            time.sleep(1.5)  # a long handler: the claim expires and is stolen meanwhile
        with db.transaction() as conn:
            conn.execute(db.sql(f"INSERT INTO {proj} (k) VALUES (?)"), ("from-slow",))
            if in_tx:
                time.sleep(1.5)  # stolen while this transaction is open
            ts.store(P, 0, Token(99), "slow", conn=conn)
        out.put("committed")
    except el.ClaimLostError as exc:
        out.put(f"lost: {exc}")


@pytest.mark.parametrize("in_tx", [False, True], ids=["stolen-before-tx", "stolen-in-tx"])
def test_stolen_claim_makes_the_old_owners_commit_roll_back(ts_url, in_tx) -> None:
    if in_tx and ts_url.startswith("sqlite"):
        pytest.skip("SQLite: an open write transaction holds the lock, so the thief waits")
    ts = el.open_token_store(ts_url, claim_timeout=0.5)
    ts.initialize(P)
    proj = ts.db.table("proj")
    ts.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {proj} (k TEXT)"])
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    proc = ctx.Process(target=_slow_owner, args=(ts_url, proj, in_tx, barrier, out))
    proc.start()
    barrier.wait()
    deadline = time.monotonic() + 10
    while ts.claim(P, 0, "thief") is None:  # stealable after 0.5 s
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ts.store(P, 0, Token(5), "thief")
    result = out.get(timeout=30)
    proc.join(10)
    assert result.startswith("lost") and "thief" in result
    assert ts.db.query(f"SELECT k FROM {proj}") == []
    assert ts.token(P, 0) == Token(5)


def _splitter(url: str, rounds: int, barrier, out) -> None:
    ts = el.open_token_store(url)
    rng = random.Random(1)
    barrier.wait()
    done = 0
    for _ in range(rounds):
        segs = ts.segments(P)
        seg = rng.choice(segs)
        if ts.claim(P, seg.id, "splitter") is None:
            continue
        try:
            if seg.mask < 15 and rng.random() < 0.6:
                ts.split(P, seg.id, "splitter")
                done += 1
            elif seg.mask and ts.claim(P, seg.sibling().id, "splitter"):
                ts.merge(P, seg.id, "splitter")
                done += 1
        except (el.ClaimLostError, el.InvalidInputError):
            pass
        ts.release_all(P, "splitter")
    out.put(("splitter", done))


def _claimer(url: str, owner: str, rounds: int, barrier, out) -> None:
    ts = el.open_token_store(url)
    barrier.wait()
    claims = 0
    for _ in range(rounds):
        for seg in ts.segments(P):
            if ts.claim(P, seg.id, owner):
                claims += 1
                ts.store(P, seg.id, Token(claims), owner)
                ts.release(P, seg.id, owner)
    out.put((owner, claims))


def test_concurrent_split_merge_and_claims_keep_a_partition(ts_url) -> None:
    ts = el.open_token_store(ts_url)
    ts.initialize(P, segments=3)  # an uneven tree: 0/1, 1/3, 3/3
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_splitter, args=(ts_url, 150, barrier, out))]
    procs += [
        ctx.Process(target=_claimer, args=(ts_url, f"claimer-{i}", 30, barrier, out))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    results = dict(_finish(procs, out, 4))
    assert results["splitter"] > 5  # splits and merges really happened
    segs = ts.segments(P)
    assert len({s.id for s in segs}) == len(segs)
    assert sum(2**32 // s.size for s in segs) == 2**32
    for h in random.Random(7).sample(range(2**32), 500):
        assert sum(s.matches(h) for s in segs) == 1
    assert all(s.owner is None for s in ts.status(P))


def _initializer(url: str, n: int, barrier, out) -> None:
    ts = el.open_token_store(url)
    barrier.wait()
    out.put((n, ts.initialize(P, segments=n)))


def test_initialize_from_many_processes_at_once(ts_url) -> None:
    counts = [random.choice([2, 3, 4, 6, 8]) for _ in range(PROCS)]
    procs, out = _start(_initializer, [(ts_url, n) for n in counts])
    results = _finish(procs, out, PROCS)
    created = [n for n, was_created in results if was_created]
    assert len(created) == 1
    ts = el.open_token_store(ts_url)
    assert ts.segments(P) == Segment.initial(created[0])
