"""``run --engine spark`` keeps a windowed aggregation up to date in micro-batches that write
what the local engine writes on the same store: windows, where each closed, late inputs,
counts, entries, clock rows, what ``on_close`` appends; across runs and with the local
engine before it. What it does not fold is refused before any work."""

from __future__ import annotations

import random
from typing import Any

import pytest

import eventlanes as el
from eventlanes.tokens import Token
from tests.processing_helpers import run_until_caught_up
from tests.test_spark_windows import CASES, append, attempts, define, results

#: every kind of CASES: tumbling, hopping and sessions, either clock, each late mode; each
#: key's clock with a retention (windows deleted by each key's clock)
CONTINUOUS = dict(CASES)
CONTINUOUS["tumbling with an offset, key clock, counted, retain 1 min, Python fold"] = {
    **CONTINUOUS.pop("tumbling with an offset, key clock, counted, Python fold"),
    "retain": "1m",
}
#: a closed session is kept at least its gap (40 s) past the clock, more than ``retain``
CONTINUOUS["session, store clock, kept, retain 10 s, Python fold"] = {
    **CASES["session, store clock, kept, Python fold"],
    "retain": "10s",
}


def outcome(app: el.App, agg: el.Aggregation, keys: list[str], case: dict) -> tuple:
    """:func:`results`; with each key's clock, the clock rows without their positions: a
    segment's row moves when its segment writes, and the local engine writes a segment none
    of whose keys had an input only when it has to (the positions tell nothing there)."""
    windows, late, counts, (wins, entries, clocks) = results(app, agg, keys)
    if case.get("clock") == "key":
        clocks = tuple(sorted({latest for _, latest in clocks}, key=repr))
    return windows, late, counts, (wins, entries, clocks)


def runner_of(app: el.App, name: str, spark: Any, max_rows: int) -> Any:
    """A continuous runner holding every claim, its batches run by hand (start() would loop)."""
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all

    runner = ContinuousAggregation(app, name, spark=spark, max_rows=max_rows)
    app.initialize(name)  # as start() does
    runner.records = claim_all(app.tokens, name, runner.owner)
    return runner


def batches(app: el.App, name: str, spark: Any, max_rows: int) -> int:
    runner = runner_of(app, name, spark, max_rows)
    n = 0
    try:
        while runner.run_batch():
            n += 1
    finally:
        runner.stop()
    return n


def closers(app: el.App, agg: el.Aggregation) -> None:
    @agg.on_close
    def closed(window: el.WindowResult, name: str = agg.name) -> el.NewEvent:
        return el.NewEvent("MinuteClosed", {"of": name, "start": window.start_us,
                                            "ok": window.value["ok"]})  # fmt: skip


def closes_of(app: el.App, name: str, amends: bool = False) -> Any:
    """What ``on_close`` appended for ``name``: every event; with amendments, each window's
    last (how many revisions one write holds depends on where writes fall)."""
    found = [(e.stream_id.split(":", 1)[1], e.data["start"], e.data["ok"])
             for e in app.store.iter_events() if e.type == "MinuteClosed"
             and e.data["of"] == name]  # fmt: skip
    return {(k, s): ok for k, s, ok in found} if amends else sorted(found)


@pytest.mark.parametrize(
    ("backend", "case"),
    [
        *(("sqlite", c) for c in CONTINUOUS),
        ("postgres", "hopping, store clock, amended, declared"),
        ("postgres", "session, store clock, kept, Python fold"),
    ],
    indirect=["backend"],
)
def test_micro_batches_write_what_the_local_engine_writes(spark, store_url: str, case: str) -> None:
    """Micro-batches of 150 positions against the local engine, twice (a second runner goes
    on from the first's tokens, clock rows and open windows). The second part's robots are
    new: the first part's windows are closed by the driver, their keys having no input in a
    batch (sessions too: off any grid, each closed where the clock first reached its end);
    the clamped input closes everything open at the end."""
    app = el.App(store_url)
    aggs = {n: define(app, n, CONTINUOUS[case], segments=s)
            for n, s in (("local", 3), ("sparked", 2))}  # fmt: skip
    for agg in aggs.values():
        closers(app, agg)
    events = attempts(600, seed=len(case))
    append(app.store, events + [events[i] for i in range(0, 600, 9)])  # duplicates too
    assert batches(app, "sparked", spark, 150) >= 5
    run_until_caught_up(app, processors=["local"])
    batches(app, "sparked", spark, 150)  # past the events the local engine's on_close appended
    keys = [f"r{i}" for i in range(8)]
    want = results(app, aggs["local"], keys)
    windows, late, counts, _ = want
    assert counts["duplicate"] == len(range(0, 600, 9)) and counts["late"] > 0
    # some closed (with retain="1m", expired soon after: by the store's clock, all), some open
    closed = any(w[3] for ws in windows.values() for w in ws)
    assert closed if "retain" not in case else not closed or "key clock" in case
    assert not all(w[3] for ws in windows.values() for w in ws)
    assert (late != []) == (CONTINUOUS[case].get("late") != "count")
    assert results(app, aggs["sparked"], keys) == want
    amends = CONTINUOUS[case].get("late") == "amend"
    assert closes_of(app, "sparked", amends) == closes_of(app, "local", amends)
    assert closes_of(app, "local")

    more = attempts(300, seed=3, robots=3, first=600, clamp=880)
    for e in more:
        e.data["robot"] = "r" + str(5 + int(e.data["robot"][1:]))  # robots 5 to 7 only
    append(app.store, more + more[::7] + events[:5])
    assert batches(app, "sparked", spark, 150) >= 2
    run_until_caught_up(app, processors=["local"])
    batches(app, "sparked", spark, 150)
    got = outcome(app, aggs["sparked"], keys, CONTINUOUS[case])
    want = outcome(app, aggs["local"], keys, CONTINUOUS[case])
    assert got == want
    if CONTINUOUS[case].get("clock") != "key":  # closed with no input of theirs
        assert all(w[3] for k in ("r0", "r1") for w in want[0][k])
    assert closes_of(app, "sparked", amends) == closes_of(app, "local", amends)
    app.close()


def test_a_micro_batch_goes_on_from_the_local_engine(spark, tmp_path) -> None:
    """The local engine folds the first part, with its segments at the head; micro-batches
    fold the rest from its windows, entries and clock rows: the same as the local engine
    folding it all."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    case = CASES["tumbling, store clock, kept, Python fold"]
    aggs = {n: define(app, n, case, segments=2) for n in ("local", "both")}
    events = attempts(700, seed=11, clamp=690)
    append(app.store, events[:400])
    run_until_caught_up(app)
    append(app.store, events[400:] + events[:30])
    assert batches(app, "both", spark, 100) >= 3
    run_until_caught_up(app, processors=["local"])
    keys = [f"r{i}" for i in range(5)]
    assert results(app, aggs["both"], keys) == results(app, aggs["local"], keys)
    app.close()


def test_what_a_continuous_run_does_not_fold_is_refused_before_any_work(spark, tmp_path) -> None:
    from eventlanes.spark.continuous import ContinuousAggregation

    app = el.App(f"sqlite:///{tmp_path}/e.db")
    opts = dict(key="robot", time=el.event_time("ts", unit="ms"), initial=dict)
    app.aggregation("deltas", window=el.tumbling("1m"), **opts)
    with pytest.raises(el.InvalidInputError, match="'deltas' is windowed: a Delta table"):
        ContinuousAggregation(app, "deltas", spark=spark, delta=str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_a_session_closed_by_an_earlier_batch_makes_an_input_overlapping_it_late(
    spark, tmp_path
) -> None:
    """A session closed and written by one micro-batch is in the store only: an input of the
    next batch that overlaps it is late, though its own session would end past the clock.
    The closed session is kept its gap past the clock (40 s), more than ``retain`` (10 s),
    so it is still there to say so. The local engine says the same."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    opts = dict(key="robot", time=el.event_time("ts", unit="ms"), window=el.session(gap="40s"),
                lateness="20s", retain="10s", on="ScrewAttempted",
                fields={"n": el.count()})  # fmt: skip
    aggs = {n: app.aggregation(n, **opts) for n in ("local", "sparked")}
    # a at 0 s: session [0 s, 40 s), closed by b at 90 s (the clock at 70 s passed 40 s + 20 s)
    for robot, s in [("a", 0), ("b", 90), ("a", 35)]:  # one event per append: positions 1-3
        app.store.append(robot, [el.NewEvent("ScrewAttempted", {"robot": robot, "ts": s * 1000})])
    assert batches(app, "sparked", spark, 2) == 2  # positions 1-2, then 3
    run_until_caught_up(app, processors=["local"])
    for agg in aggs.values():
        assert [(w.start_us, w.end_us, w.final) for w in agg.windows("a")] == [
            (0, 40_000_000, True)
        ]
        assert [x.position for x in agg.late_events()] == [3]
    keys = ["a", "b"]
    assert results(app, aggs["sparked"], keys) == results(app, aggs["local"], keys)
    app.close()


def test_calendar_days_in_micro_batches_equal_the_local_engine(spark, tmp_path) -> None:
    """Days of Europe/Paris around the spring change (a 23-hour day), inputs up to 3 hours
    out of order, in micro-batches of 100 positions: the windows, where each closed (off any
    grid: found after the fold, for keys with inputs in a batch and by the driver for the
    others), late inputs and amendments equal the local engine's on the same store."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    case = {"window": el.calendar("day", tz="Europe/Paris"), "lateness": "1h", "late": "amend"}
    aggs = {n: define(app, n, case, segments=s) for n, s in (("local", 3), ("sparked", 2))}
    for agg in aggs.values():
        closers(app, agg)
    rng = random.Random(41)
    base = 1_774_569_600_000  # 2026-03-27T00:00:00Z, in ms

    def days(first: int, n: int, robots: range) -> list[el.NewEvent]:
        return [el.NewEvent("ScrewAttempted", {
            "robot": f"r{rng.choice(robots)}", "ok": rng.random() < 0.8,
            "ts": base + i * 600_000 - rng.randrange(3 * 3_600_000),
        }) for i in range(first, first + n)]  # fmt: skip

    append(app.store, days(0, 500, range(3)))
    assert batches(app, "sparked", spark, 100) >= 5
    run_until_caught_up(app, processors=["local"])
    batches(app, "sparked", spark, 100)  # past what the local engine's on_close appended
    append(app.store, days(500, 300, range(3, 5)))  # other robots: r0 to r2's days close
    assert batches(app, "sparked", spark, 100) >= 3
    run_until_caught_up(app, processors=["local"])
    batches(app, "sparked", spark, 100)
    keys = [f"r{i}" for i in range(5)]
    want = results(app, aggs["local"], keys)
    windows, late, counts, _ = want
    lengths = {w[1] - w[0] for ws in windows.values() for w in ws}
    assert 23 * 3_600_000_000 in lengths and 24 * 3_600_000_000 in lengths
    assert counts["late"] > 0 and any(x[4] for x in late)  # amended ones among them
    assert all(w[3] for k in ("r0", "r1", "r2") for w in windows[k])
    assert not all(w[3] for ws in windows.values() for w in ws)
    assert results(app, aggs["sparked"], keys) == want
    assert closes_of(app, "sparked", True) == closes_of(app, "local", True)
    assert closes_of(app, "local")
    app.close()


def test_segments_at_different_positions_are_refused_naming_them(spark, tmp_path) -> None:
    """A store clock's micro-batch folds one range for every segment: segments the local
    engine left at different positions are refused, nothing written."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    define(app, "w", CASES["tumbling, store clock, kept, Python fold"], segments=2)
    append(app.store, attempts(100, seed=2))
    from eventlanes.tokens.claims import claim_all, release_all

    app.initialize("w")
    held = claim_all(app.tokens, "w", "local")  # as a local engine stopped part way
    app.tokens.store("w", held[0].segment.id, Token(40), "local")
    release_all(app.tokens, "w", "local", held)
    runner = runner_of(app, "w", spark, 1000)
    try:
        with pytest.raises(el.InvalidInputError, match=r"different positions \(0, 40\)"):
            runner.run_batch()
    finally:
        runner.stop()
    assert app.get("w").windows("r0") == []  # type: ignore[attr-defined]
    assert sorted(s.token.position for s in app.tokens.status("w")) == [0, 40]
    app.close()


def test_a_continuous_run_ticks_when_idle_and_its_windows_close(spark, tmp_path) -> None:
    """With ``idle_close``, a continuous run appends a tick once no batch has run for that
    long with windows open: its clock moves and they close. The local engine, folding the
    same log (ticks included), closes the same windows at the same positions."""
    import time

    from eventlanes.spark.continuous import ContinuousAggregation

    app = el.App(f"sqlite:///{tmp_path}/e.db")
    case = {"window": el.tumbling("1m"), "idle_close": "1s", "lateness": "1s"}
    aggs = {n: define(app, n, case, segments=2) for n in ("local", "sparked")}
    now = int(time.time() * 1000)
    append(app.store, [el.NewEvent("ScrewAttempted", {"robot": f"r{i % 3}", "ok": True,
                                                      "ts": now - 600_000 + i * 1000})
                       for i in range(90)])  # fmt: skip
    runner = ContinuousAggregation(app, "sparked", spark=spark, trigger_seconds=0.2)
    runner.start()
    try:
        deadline = time.monotonic() + 90
        while runner.error is None and time.monotonic() < deadline:
            windows = [w for k in ("r0", "r1", "r2") for w in aggs["sparked"].windows(k)]
            if windows and all(w.final for w in windows):
                break
            time.sleep(0.2)
    finally:
        runner.stop()
    assert runner.error is None
    ticks = [e for e in app.store.iter_events() if e.type == "$clock.tick"]
    assert ticks and all(w.final for k in ("r0", "r1", "r2") for w in aggs["sparked"].windows(k))
    run_until_caught_up(app, processors=["local"])
    batches(app, "sparked", spark, 1000)  # past a tick the local engine may have added
    keys = ["r0", "r1", "r2"]
    assert results(app, aggs["sparked"], keys) == results(app, aggs["local"], keys)
    app.close()
