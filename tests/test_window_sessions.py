"""Session windows (issue 33): a key's inputs less than ``gap`` apart folded into one window,
a late input that bridges two sessions merging them, decided by the log's clock as the
reference loop (eventlanes.windows.reference) says, for any segment count, split, merge and
restart; declared fields merge by themselves, Python folds by their ``on_merge``."""

from __future__ import annotations

import random

import pytest

import eventlanes as el
from eventlanes.processing.windowing.clock import recorded_us
from eventlanes.windows.kinds import Session
from eventlanes.windows.reference import count_windows
from tests.processing_helpers import run_until_caught_up, wait_for

E = el.NewEvent
BASE_MS = 1_700_000_000_000
GAP = Session(20_000_000)  # 20 s
LATENESS = 30_000_000


def attempts(n: int, seed: int, robots: int = 5) -> list[E]:
    """Bursts: each robot busy for a while, then quiet; times up to 80 s out of order, so
    some inputs are late and some bridge two sessions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        robot = rng.randrange(robots)
        busy = (i // 30 + robot) % 3 != 0  # quiet a third of the time: sessions end
        at = BASE_MS + i * 1500 - rng.randrange(80_000)
        if busy:
            out.append(E("ScrewAttempted", {"robot": f"r{robot}", "ok": rng.random() < 0.8,
                                            "ts": at}))  # fmt: skip
    return out


def append(store: el.EventStore, events: list[E], per: int = 25) -> None:
    for i in range(0, len(events), per):
        store.append(f"cell-{i // per % 4}", events[i : i + per])


def define(app: el.App, name: str, segments: int, declared: bool, **more: object) -> el.Aggregation:
    common = dict(window=el.session(gap="20s"), time=el.event_time("ts", unit="ms"),
                  lateness="30s", segments=segments, persist_every=0.05, batch_size=40,
                  retain="1d")  # fmt: skip
    if declared:
        return app.aggregation(name, key="robot", on="ScrewAttempted",
                               fields={"n": el.count(), "ok": el.count(where={"ok": True})},
                               **common, **more)  # type: ignore[arg-type]  # fmt: skip
    agg = app.aggregation(name, key="robot", initial=lambda: {"n": 0, "ok": 0}, **common,
                          **more)  # type: ignore[arg-type]  # fmt: skip

    @agg.on("ScrewAttempted")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1
        state["ok"] += event.data["ok"]

    @agg.on_merge
    def merge(into: dict, other: dict) -> None:
        into["n"] += other["n"]
        into["ok"] += other["ok"]

    return agg


def reference(app: el.App, clock: str = "store"):
    events = list(app.store.iter_events(types=["ScrewAttempted"]))
    inputs = [(e.position, e.data["robot"], e.data["ts"] * 1000, recorded_us(e)) for e in events]
    return count_windows(inputs, GAP, LATENESS, LATENESS, clock)


def windows(agg: el.Aggregation) -> dict[tuple[str, int, int], tuple[int, bool]]:
    return {(f"r{r}", w.start_us, w.end_us): (w.value["n"], w.final)
            for r in range(5) for w in agg.windows(f"r{r}")}  # fmt: skip


def expected(ref) -> dict[tuple[str, int, int], tuple[int, bool]]:
    closed = {(k, s, e) for _, k, s, e in ref.closes}
    return {w: (n, w in closed) for w, n in ref.counts.items()}


def test_sessions_equal_the_reference_for_1_and_3_segments_and_both_clocks(
    store_url: str,
) -> None:
    app = el.App(store_url)
    aggs = {
        (n, declared): define(app, f"s{n}{'d' if declared else 'p'}", n, declared)
        for n in (1, 3) for declared in (True, False)
    }  # fmt: skip
    keyed = define(app, "keyed", 2, True, clock="key")
    append(app.store, attempts(900, seed=3))
    run_until_caught_up(app)
    ref = reference(app)
    want = expected(ref)
    late = sorted(p for p, *_ in ref.late)
    merged = sum(1 for n, _ in want.values() if n > 1)
    assert (
        late
        and merged
        and any(f for _, f in want.values())
        and not all(f for _, f in want.values())
    )  # late, multi-input, closed and open sessions: the comparison proves something
    for label, agg in aggs.items():
        assert windows(agg) == want, label
        assert [x.position for x in agg.late_events()] == late, label
        counts = agg.window_counts()
        total = sum(1 for _ in app.store.iter_events(types=["ScrewAttempted"]))
        assert counts["folded"] == total - len(late) and counts["late"] == len(late), label
    assert windows(keyed) == expected(reference(app, "key"))


def test_bridging_sessions_across_writes_restarts_splits_and_merges(store_url: str) -> None:
    """Sessions written in one run, bridged by an input of the next (their rows replaced by
    the merged one), with a split and a merge mid-run: the same as one plain run."""
    events = attempts(900, seed=4)
    app = el.App(store_url)
    plain = define(app, "plain", 1, False)
    append(app.store, events[:300])
    run_until_caught_up(app)
    app.close()
    again = el.App(store_url)
    plain = define(again, "plain", 1, False)
    moved = define(again, "moved", 2, True)
    again.start()
    try:
        for round_ in range(3):
            lo = 300 + round_ * 200
            append(again.store, events[lo : lo + 100])
            seg = again.status("moved").segments[round_ % 2].segment
            again.split("moved", seg.id)
            append(again.store, events[lo + 100 : lo + 200])
            again.merge("moved", seg.id)
        again.wait_until_caught_up(60)
    finally:
        again.stop()
    want = expected(reference(again))
    assert windows(plain) == windows(moved) == want


def test_the_window_rows_are_the_sessions_and_bridged_ones_are_deleted(tmp_path) -> None:
    """Two sessions written apart, then one input that bridges them: one row remains."""
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    agg = define(app, "s", 1, True)

    def at(s: int) -> E:
        return E("ScrewAttempted", {"robot": "r0", "ok": True, "ts": BASE_MS + s * 1000})

    app.store.append("c", [at(0), at(30)])  # [0, 20) and [30, 50): apart
    run_until_caught_up(app)
    assert [(w.start_us, w.end_us) for w in agg.windows("r0")] == [
        ((BASE_MS + 0) * 1000, (BASE_MS + 20_000) * 1000),
        ((BASE_MS + 30_000) * 1000, (BASE_MS + 50_000) * 1000),
    ]
    app.store.append("c", [at(15)])  # overlaps both: one session [0, 50)
    run_until_caught_up(app)
    (w,) = agg.windows("r0")
    assert (w.start_us, w.end_us, w.value["n"], w.final) == (
        BASE_MS * 1000, (BASE_MS + 50_000) * 1000, 3, False,
    )  # fmt: skip
    table = app.db.table("window_states")
    assert app.db.query(f"SELECT count(*) FROM {table}") == [(1,)]


def test_what_sessions_cannot_do_is_refused_clearly(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    session = el.session(gap="1m")
    with pytest.raises(el.InvalidInputError, match="late='amend' is not available for session"):
        app.aggregation("a", key="k", on="T", fields={"n": el.count()}, window=session,
                        late="amend")  # fmt: skip
    with pytest.raises(el.InvalidInputError, match="field 'f' is el.first"):
        app.aggregation("b", key="k", on="T", fields={"f": el.first("x")}, window=session)
    declared = app.aggregation("c", key="k", on="T", fields={"n": el.count()}, window=session)
    with pytest.raises(el.InvalidInputError, match="is declarative"):
        declared.on_merge(lambda into, other: None)
    tumbling = app.aggregation("d", key="k", initial=dict, window=el.tumbling("1m"))
    with pytest.raises(el.InvalidInputError, match="belongs to an aggregation with session"):
        tumbling.on_merge(lambda into, other: None)
    no_merge = app.aggregation("e", key="k", initial=dict, window=session)
    no_merge.on("T")(lambda s, e: None)
    with pytest.raises(el.InvalidInputError, match="give a merge function"):
        app.start(["e"])
    app.stop()


def test_a_merge_that_returns_a_new_state_stops_its_segment_instead_of_losing_it(
    tmp_path,
) -> None:
    """``on_merge`` merges in place: one returning a new state (whose result would be
    dropped) stops the segment, naming it, and nothing of that batch is written."""
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    agg = app.aggregation("m", key="robot", initial=lambda: {"n": 0},
                          window=el.session(gap="20s"), time=el.event_time("ts", unit="ms"),
                          lateness="30s")  # fmt: skip

    @agg.on("ScrewAttempted")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1

    @agg.on_merge
    def merge(into: dict, other: dict) -> dict:
        return {"n": into["n"] + other["n"]}  # a new state: would be lost

    def at(s: int) -> E:
        return E("ScrewAttempted", {"robot": "r0", "ok": True, "ts": BASE_MS + s * 1000})

    app.store.append("c", [at(0), at(30), at(15)])  # the third bridges the first two
    app.start(["m"])
    try:
        wait_for(lambda: app.status("m").segments[0].errors > 0, timeout=30, what="the error")
    finally:
        app.stop()
    (segment,) = app.status("m").segments
    assert "on_merge merge returned dict" in (segment.last_error or "")
    assert segment.position == 0 and agg.windows("r0") == []


@pytest.mark.parametrize("batch", [1, 40])
def test_an_input_overlapping_a_closed_session_is_late_and_the_closed_one_stays(
    tmp_path, batch: int
) -> None:
    """A closed session is never overlapped: an input within it (not late by the clock
    alone) is late, and one that would bridge into it cannot take its start."""
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    agg = app.aggregation("o", key="robot", on="ScrewAttempted", fields={"n": el.count()},
                          window=el.session(gap="50s"), time=el.event_time("ts", unit="ms"),
                          batch_size=batch, persist_every=0)  # fmt: skip

    def at(robot: str, s: int) -> E:
        return E("ScrewAttempted", {"robot": robot, "ok": True, "ts": BASE_MS + s * 1000})

    # A at 100 opens [100, 150); B at 160 moves the clock past 150: A's closes; A at 120
    # overlaps it (late), A at 100 too; A at 200 opens a session of its own
    app.store.append("c", [at("A", 100), at("B", 160), at("A", 120), at("A", 100), at("A", 200)])
    run_until_caught_up(app)
    ms = BASE_MS * 1000
    got = [(w.start_us - ms, w.end_us - ms, w.value["n"], w.final) for w in agg.windows("A")]
    assert got == [(100_000_000, 150_000_000, 1, True), (200_000_000, 250_000_000, 1, False)]
    assert [e.position for e in agg.late_events()] == [3, 4]
    events = list(app.store.iter_events())
    inputs = [(e.position, e.data["robot"], e.data["ts"] * 1000, recorded_us(e)) for e in events]
    ref = count_windows(inputs, Session(50_000_000), 0, 0)
    assert sorted(p for p, *_ in ref.late) == [3, 4]  # the reference says the same
    assert {(k, s - ms, e - ms): n for (k, s, e), n in ref.counts.items() if k == "A"} == {
        ("A", 100_000_000, 150_000_000): 1,
        ("A", 200_000_000, 250_000_000): 1,
    }


def test_a_closed_session_is_kept_at_least_its_gap_whatever_retain_says(tmp_path) -> None:
    """``retain="0s"``: a closed session is still kept its gap behind the clock, or an input
    overlapping it after it was deleted would open a session over it (the reference: late)."""
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    agg = app.aggregation("r", key="robot", on="ScrewAttempted", fields={"n": el.count()},
                          window=el.session(gap="10s"), time=el.event_time("ts", unit="ms"),
                          retain="0s", batch_size=2, persist_every=0)  # fmt: skip

    def at(robot: str, s: int) -> E:
        return E("ScrewAttempted", {"robot": robot, "ok": True, "ts": BASE_MS + s * 1000})

    app.store.append("c", [at("A", 0), at("B", 12)])  # B's time closes A's [0, 10)
    run_until_caught_up(app)
    app.store.append("c", [at("A", 5)])  # overlaps it: late, in a write of its own
    run_until_caught_up(app)
    assert [e.position for e in agg.late_events()] == [3]
    assert [(w.start_us, w.value["n"]) for w in agg.windows("A")] == [(BASE_MS * 1000, 1)]
    events = list(app.store.iter_events())
    inputs = [(e.position, e.data["robot"], e.data["ts"] * 1000, recorded_us(e)) for e in events]
    assert [p for p, *_ in count_windows(inputs, Session(10_000_000), 0, 0).late] == [3]
