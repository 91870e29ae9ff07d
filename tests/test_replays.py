"""Replay ends per part, end to end: real processors on SQLite and PostgreSQL are split and
merged while they run, run on part of their segments, and reset between runs (their halves at
different positions); every event is handled once per reset, with the right replay flag, and
the ``disallow_replay`` handler runs exactly for the first-time events."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

import pytest

import eventlanes as el
from tests.processing_helpers import run_until_caught_up, serial_pk, wait_for

E = el.NewEvent


def define(store_url: str) -> tuple[el.App, dict[str, Any]]:
    """A processor recording (position, replay flag, reset number) per handled event, and
    "mailing" (a ``disallow_replay`` handler) in the same transaction: both exactly once."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("rec", segments=2, batch_size=7)
    state: dict[str, Any] = {"epoch": 0}
    db = app.db
    db.run_ddl(
        [
            f"CREATE TABLE {db.table('rec_rows')} (id {serial_pk(db)}, position BIGINT, "
            "replay INTEGER, epoch INTEGER)",
            f"CREATE TABLE {db.table('rec_mails')} (position BIGINT)",
        ]
    )

    @proc.on_any
    def record(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(
            f"INSERT INTO {ctx.table('rec_rows')} (position, replay, epoch) VALUES ({p}, {p}, {p})",
            (event.position, int(ctx.is_replay), state["epoch"]),
        )

    @proc.on_any
    @el.disallow_replay
    def mail(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(
            f"INSERT INTO {ctx.table('rec_mails')} (position) VALUES ({ctx.param})",
            (event.position,),
        )

    return app, state


def rows(app: el.App) -> list[tuple[int, int, int]]:
    t = app.db.table("rec_rows")
    return [tuple(r) for r in app.db.query(f"SELECT position, replay, epoch FROM {t} ORDER BY id")]


def steer(app: el.App, rng: random.Random) -> None:
    """A random split, or a merge of two siblings, through the owner when one runs."""
    segments = app.status("rec").segments
    present = {s.segment for s in segments}
    mergeable = [s for s in present if s.mask and s.sibling() in present]
    if mergeable and (rng.random() < 0.5 or len(present) >= 8):
        seg = rng.choice(sorted(mergeable))
        assert app.merge("rec", seg.id).startswith(("merged", "merge of")), seg
    else:
        seg = rng.choice(sorted(present))
        assert app.split("rec", seg.id).startswith(("split", "split of")), seg


def idle(app: el.App) -> bool:
    """Every segment this node holds has reached the head (nothing to do until more come)."""
    held = [s for s in app.status("rec").segments if s.owner]
    return bool(held) and all(s.caught_up for s in held)


def append(app: el.App, rng: random.Random, n: int) -> None:
    for _ in range(n):
        app.store.append(f"k-{rng.randrange(17)}", [E("Step")])


def merge_all(app: el.App) -> None:
    """Merge every pair of siblings (nobody runs): halves that got apart become one token."""
    while True:
        present = {s.segment for s in app.status("rec").segments}
        pairs = sorted(s for s in present if s.mask and s.sibling() in present)
        if not pairs:
            return
        app.merge("rec", pairs[0].id)


#: The skeleton of each history; where steps go, which segments, how far: by the seed.
STEPS = ["part", "merge", "reset", "run", "part", "steer", "run", "reset", "part", "merge",
         "run", "reset"]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_splits_merges_and_resets_keep_every_replay_flag_right(store_url: str, seed: int) -> None:
    rng = random.Random(seed)
    app, state = define(store_url)
    resets: list[int] = []  # each reset's position, by epoch - 1
    per_part = 0  # resets that left a replay end per part (the case refused before)
    try:
        append(app, rng, 40)
        for step in STEPS:
            if step in ("run", "part"):
                # "part": one of two static nodes runs until its segments are at the head, so
                # the others stay behind; "run": all, split and merged while running, stopped
                # at some point (a replay half done).
                count = len(app.status("rec").segments)  # node 1 of 2 needs two to get one
                node = rng.randrange(2) if count > 1 else 0
                options = {"node_index": node, "nodes": 2} if step == "part" else {}
                before = len(rows(app))
                app.start(**options)
                try:
                    if step == "run":
                        steer(app, rng)  # carried out by the running owner
                        append(app, rng, rng.randrange(5, 20))
                        steer(app, rng)
                        wait_for(lambda b=before: len(rows(app)) > b or idle(app), timeout=30,
                                 what="progress")  # fmt: skip
                    else:
                        wait_for(lambda: idle(app), timeout=30, what="this node's segments")
                finally:
                    app.stop()
            elif step == "reset":
                to = rng.randrange(app.store.head() // 3)
                assert app.reset("rec", to=to, context={"n": len(resets)}) == to
                resets.append(to)
                state["epoch"] = len(resets)
                per_part += any(s.token.replays_by_part for s in app.status("rec").segments)
            elif step == "merge":
                merge_all(app)
            else:
                steer(app, rng)  # nobody runs: done directly
        append(app, rng, 10)
        run_until_caught_up(app, 60)
        log = rows(app)
        t = app.db.table("rec_mails")
        mails = [r[0] for r in app.db.query(f"SELECT position FROM {t}")]
        head = app.store.head()
    finally:
        app.close()
    assert per_part, "no reset left ends per part: the history missed its case"
    check(log, mails, resets, head)


def check(log: list[tuple[int, int, int]], mails: list[int], resets: list[int], head: int) -> None:
    """The model: an event is a replay exactly when the processor had passed it before (handled
    it in an earlier epoch, or a reset passed over it); once per epoch at most; every event
    past the last reset's position once in the last epoch; mailed once, the first time."""
    by_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    handled_before: set[int] = set()
    passed_over = 0  # positions up to here were passed over by a reset
    for epoch in range(len(resets) + 1):
        if epoch:
            passed_over = max(passed_over, resets[epoch - 1])
        for position, replay, e in log:
            if e != epoch:
                continue
            by_epoch[epoch][position] += 1
            expected = position in handled_before or position <= passed_over
            assert bool(replay) == expected, (
                f"epoch {epoch}: event {position} flagged replay={bool(replay)}"
            )
            if epoch:
                assert position > resets[epoch - 1], f"event {position} before the reset's"
        handled_before |= set(by_epoch[epoch])
    twice = {e: [p for p, c in counts.items() if c > 1] for e, counts in by_epoch.items()}
    assert not any(twice.values()), f"handled twice in one epoch: {twice}"
    last = len(resets)
    start = resets[-1] if resets else 0
    assert set(by_epoch[last]) == set(range(start + 1, head + 1)), "not every event handled"
    first_time = [p for p, replay, _ in log if not replay]
    assert Counter(mails) == Counter(first_time) and len(set(mails)) == len(mails)


def test_a_replay_token_stored_by_the_previous_release_replays_as_before(store_url: str) -> None:
    """A token row written by the release before replay ends per part (one end for the whole
    segment, an object) is read as it was: events up to the end are replays, with the context."""
    app, _ = define(store_url)
    contexts: list[Any] = []
    app.get("rec").on_any(lambda event, ctx: contexts.append(ctx.replay_context))
    append(app, random.Random(0), 12)
    app.initialize("rec")
    t = app.db.table("tokens")
    detail = '{"replay":{"until":5,"context":{"why":"old"}}}'
    app.db.run_ddl([f"UPDATE {t} SET token_detail = '{detail}' WHERE processor = 'rec'"])
    run_until_caught_up(app, 30)
    log = rows(app)
    app.close()
    assert sorted((p, r) for p, r, _ in log) == [(p, int(p <= 5)) for p in range(1, 13)]
    assert contexts.count({"why": "old"}) == 5 and contexts.count(None) == 7


def test_a_reset_of_a_merged_segment_writes_ends_per_part_the_previous_release_refuses(
    store_url: str,
) -> None:
    """A merged segment whose halves had got apart, reset below its far half (refused before):
    the row holds a list of ends (the previous release fails on it loudly, not silently), and
    the lagging half's first-time events are not taken for replays."""
    app, _ = define(store_url)
    append(app, random.Random(5), 30)
    app.start(node_index=0, nodes=2)  # only 0/1 runs
    try:
        wait_for(lambda: app.status("rec").segments[0].caught_up, what="segment 0/1")
    finally:
        app.stop()
    assert app.merge("rec", 1) == "merged 1/1 and 0/1 into 0/0"
    assert app.reset("rec", context="v2") == 0
    t = app.db.table("tokens")
    [(detail,)] = app.db.query(f"SELECT token_detail FROM {t} WHERE processor = 'rec'")
    assert detail.startswith('{"replay":[[0,1,30]]')  # 0/1 replays to 30; 1/1 nothing
    first = {p for p, _, _ in rows(app)}
    run_until_caught_up(app, 30)
    log = rows(app)
    app.close()
    assert all(not r for _, r, _ in log[: len(first)])
    replayed = sorted((p, r) for p, r, e in log[len(first) :])
    assert replayed == [(p, int(p in first)) for p in range(1, 31)]


# -- what a reset would do, before it is done ---------------------------------------------------
def test_a_reset_plan_counts_replays_per_part_exactly(store_url: str) -> None:
    """The counts of ``reset_plan`` (what ``eventlanes reset`` asks about): by the tokens' own
    ends, per segment and per part, equal to what the reset then replays."""
    app, _ = define(store_url)
    append(app, random.Random(9), 40)
    plan = app.reset_plan("rec")  # never ran: nothing to replay
    assert (plan.replays, plan.first_time, plan.warnings) == (0, 40, [])
    app.start(node_index=0, nodes=2)  # only 0/1 runs
    try:
        wait_for(lambda: app.status("rec").segments[0].caught_up, what="segment 0/1")
    finally:
        app.stop()
    handled = {p for p, _, _ in rows(app)}
    for step in ("apart", "merged"):
        plan = app.reset_plan("rec", to=5)
        expected = len({p for p in handled if p > 5})
        assert (plan.replays, plan.first_time) == (expected, 35 - expected), step
        assert plan.to == 5 and plan.held == []
        if step == "apart":
            assert app.merge("rec", 1) == "merged 1/1 and 0/1 into 0/0"
    assert app.reset("rec", to=5) == 5
    before = len(rows(app))
    run_until_caught_up(app, 30)
    replayed = rows(app)[before:]
    app.close()
    assert sum(r for _, r, _ in replayed) == expected and len(replayed) == 35


def test_reset_warnings_name_what_would_be_written_twice(store_url: str) -> None:
    app = el.App(store_url, claim_timeout=2)
    writes = app.processor("writes")
    writes.on_any(lambda e, ctx: None)
    cleared = app.processor("cleared")
    cleared.on_any(lambda e, ctx: None)
    cleared.on_reset(lambda ctx: None)
    mails = app.processor("mails")
    mails.on_any(el.disallow_replay(lambda e, ctx: None))  # nothing runs on a replay
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=dict)
    totals.on("Step")(lambda state, e: None)
    # its on_reset clears its states: its stage's are not (before, no word of it)
    staged = app.aggregation("staged", key=lambda e: e.stream_id, initial=dict)
    staged.on("Step")(lambda state, e: E("Seen", {}))
    staged.on_reset(lambda ctx: None)
    staged.downstream("seen", key=lambda e: "all", initial=dict).on("Seen")(lambda s, e: None)
    append(app, random.Random(1), 6)
    names = ["writes", "cleared", "mails", "totals", "staged"]
    run_until_caught_up(app, 30, names)
    warnings = {n: app.reset_plan(n).warnings for n in names}
    head = app.reset_plan("cleared", to="head")
    app.close()
    assert len(warnings["writes"]) == 1 and "written a second time" in warnings["writes"][0]
    assert "6 replayed event(s)" in warnings["writes"][0]
    assert warnings["cleared"] == warnings["mails"] == []
    assert len(warnings["totals"]) == 1 and "dropped as duplicates" in warnings["totals"][0]
    assert len(warnings["staged"]) == 1 and "downstream stages ('seen')" in warnings["staged"][0]
    # on_reset handlers that clear what nothing builds again
    assert (
        head.replays == 0 and "replays nothing, but its on_reset handlers run" in head.warnings[0]
    )
