"""Windowed aggregations on the local engine (issue 33): each input folded into the windows
of its time, late ones decided by the log's clock (the same for any segment count, split,
merge or kill), kept, amended or counted, and every input accounted for."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes.processing.windowing.clock import recorded_us
from eventlanes.windows.kinds import Tumbling
from eventlanes.windows.reference import count_windows
from eventlanes.windows.spec import as_datetime
from tests.apps.windows_app import define
from tests.processing_helpers import kill_again_and_again, run_until_caught_up, wait_for

E = el.NewEvent
BASE_MS = 1_700_000_000_000
MINUTE = Tumbling(60_000_000)
LATENESS = 30_000_000


def attempts(n: int, seed: int, robots: int = 6, jitter_ms: int = 120_000) -> list[E]:
    """A second apart, each robot's clock off by up to two minutes behind: many late."""
    rng = random.Random(seed)
    return [
        E("ScrewAttempted", {"robot": f"r{rng.randrange(robots)}", "ok": rng.random() < 0.8,
                             "ts": BASE_MS + i * 1000 - rng.randrange(jitter_ms)})
        for i in range(n)
    ]  # fmt: skip


def append(store: el.EventStore, events: list[E], per: int = 50) -> None:
    for i in range(0, len(events), per):
        store.append(f"cell-{i // per % 4}", events[i : i + per])


def inputs(app: el.App) -> list[tuple[int, str, int, int]]:
    return [
        (e.position, e.data["robot"], e.data["ts"] * 1000, recorded_us(e))
        for e in app.store.iter_events(types=["ScrewAttempted"])
    ]


def expected(app: el.App):
    """The reference loop's windows (ok/failed) and late inputs over the store."""
    events = {e.position: e for e in app.store.iter_events(types=["ScrewAttempted"])}
    ref = count_windows(inputs(app), MINUTE, LATENESS, LATENESS)
    late_positions = {p for p, *_ in ref.late}
    want: dict[tuple[str, int, int], dict[str, int]] = {}
    for p, e in events.items():
        if p in late_positions:
            continue
        (start, end), key = MINUTE.windows(e.data["ts"] * 1000)[0], e.data["robot"]
        w = want.setdefault((key, start, end), {"ok": 0, "failed": 0})
        w["ok" if e.data["ok"] else "failed"] += 1
    return ref, want


def got(agg: el.Aggregation, keys: set[str]) -> dict[tuple[str, int, int], dict[str, int]]:
    return {(k, w.start_us, w.end_us): w.value for k in keys for w in agg.windows(k)}


def finals(agg: el.Aggregation, keys: set[str]) -> set[tuple[str, int, int]]:
    return {(k, w.start_us, w.end_us) for k in keys for w in agg.windows(k) if w.final}


def test_windows_equal_the_reference_for_1_3_and_6_segments(store_url: str) -> None:
    app = el.App(store_url)
    aggs: dict[object, el.Aggregation] = {n: define(app, f"screws{n}", n) for n in (1, 3, 6)}
    aggs["3, tracking"] = define(app, "tracking", 3, mode="tracking")  # a reader per segment
    append(app.store, attempts(1500, seed=1))
    run_until_caught_up(app)
    ref, want = expected(app)
    keys = {k for k, _, _ in want}
    late = sorted({p for p, *_ in ref.late})
    assert late and want  # the data has both, or the comparison proves little
    closed = {(k, s, e) for _, k, s, e in ref.closes}
    for n, agg in aggs.items():
        assert got(agg, keys) == want, n
        assert [x.position for x in agg.late_events()] == late, n
        assert finals(agg, keys) == closed, n  # closed exactly where the clock passed them
        counts = agg.window_counts()
        assert counts == {"folded": 1500 - len(late), "late": len(late), "clamped": 0,
                          "duplicate": 0}, n  # fmt: skip


def test_calendar_days_equal_the_reference_for_1_and_3_segments(store_url: str) -> None:
    """Days of Europe/Paris across the autumn change (a 25-hour day), inputs up to 5 hours
    out of order: the windows, late inputs and closes equal the reference loop's, on both
    stores and any segment count (calendar windows fold by rows)."""
    day = el.calendar("day", tz="Europe/Paris")
    aggs = {}
    app = el.App(store_url)
    for n in (1, 3):
        agg = aggs[n] = app.aggregation(
            f"days{n}", key="robot", initial=lambda: {"ok": 0, "failed": 0}, window=day,
            time=el.event_time("ts", unit="ms"), lateness="1h", retain="40000d", segments=n,
            batch_size=40,
        )  # fmt: skip

        @agg.on("ScrewAttempted")
        def add(state: dict, event: el.Event) -> None:
            state["ok" if event.data["ok"] else "failed"] += 1

    rng = random.Random(5)
    base = 1_792_972_800_000  # 2026-10-24T00:00:00Z, in ms: the change is on the 25th
    events = [E("ScrewAttempted", {"robot": f"r{rng.randrange(4)}", "ok": rng.random() < 0.8,
                                   "ts": base + i * 900_000 - rng.randrange(5 * 3_600_000)})
              for i in range(400)]  # fmt: skip
    append(app.store, events)
    run_until_caught_up(app)
    ref = count_windows(inputs(app), day, 3_600_000_000, 3_600_000_000)
    keys = {f"r{i}" for i in range(4)}
    assert ref.late and 25 * 3_600_000_000 in {e - s for _, s, e in ref.counts}
    closed = {(k, s, e) for _, k, s, e in ref.closes}
    for n, agg in aggs.items():
        counted = {(k, w.start_us, w.end_us): w.value["ok"] + w.value["failed"]
                   for k in keys for w in agg.windows(k)}  # fmt: skip
        assert counted == ref.counts, n
        assert [x.position for x in agg.late_events()] == sorted({p for p, *_ in ref.late}), n
        assert finals(agg, keys) == closed, n


def test_split_and_merge_mid_run_change_nothing(store_url: str) -> None:
    app = el.App(store_url)
    agg = define(app, "screws", 2)
    plain = define(app, "plain", 1)
    events = attempts(800, seed=2)
    app.start()
    try:
        for round_ in range(4):
            append(app.store, events[round_ * 200 : round_ * 200 + 100])
            seg = app.status("screws").segments[round_ % 2].segment
            app.split("screws", seg.id)
            append(app.store, events[round_ * 200 + 100 : round_ * 200 + 200])
            app.merge("screws", seg.id)
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    ref, want = expected(app)
    keys = {k for k, _, _ in want}
    assert got(agg, keys) == got(plain, keys) == want
    assert [x.position for x in agg.late_events()] == sorted({p for p, *_ in ref.late})


# PostgreSQL only: its segments write side by side (SQLite's one at a time); the crash path
# (windows, late rows and the clock row written with the token) is the same code on both
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_sigkilled_workers_leave_the_same_windows(store_url: str, tmp_path: Path) -> None:
    """Workers are SIGKILLed again and again while events arrive: every window, late input
    and count ends as the reference says (each written once, with its token)."""
    import os
    import threading

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "EVENTLANES_TEST_APP_URL": store_url}
    log = tmp_path / "workers.log"
    app = el.App(store_url, claim_timeout=1.5)
    agg = define(app, "screws", 3)
    app.migrate()

    def worker() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.windows_app:app",
             "--no-progress"], cwd=root, env=env, stdout=subprocess.DEVNULL,
            stderr=log.open("a"),
        )  # fmt: skip

    events = attempts(3000, seed=3)

    def load() -> None:  # over about 10 s: kills land while workers fold
        for i in range(0, len(events), 30):
            append(app.store, events[i : i + 30])
            threading.Event().wait(0.1)

    loader = threading.Thread(target=load)
    loader.start()
    workers = [worker(), worker()]
    try:
        kills = kill_again_and_again(workers, worker, loader.is_alive, 6, (0.8, 1.6), seed=7)
        loader.join()
        try:
            app.wait_until_caught_up(120)
        except (AssertionError, TimeoutError):
            print("\n".join(log.read_text().splitlines()[-60:]))
            raise
    finally:
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.wait(60)
    assert kills >= 6
    ref, want = expected(app)
    keys = {k for k, _, _ in want}
    assert got(agg, keys) == want
    late = sorted({p for p, *_ in ref.late})
    assert [x.position for x in agg.late_events()] == late
    assert agg.window_counts()["folded"] + agg.window_counts()["late"] == 3000


def chain(offset: int) -> dict:
    return {"source_chain": [{"source": "robots", "partition": 0, "offset": offset}]}


@pytest.mark.parametrize("mode", ["park", "amend", "count"])
def test_every_input_is_folded_late_or_a_duplicate(store_url: str, mode: str) -> None:
    app = el.App(store_url)
    agg = define(app, "screws", 2, late=mode)
    events = attempts(400, seed=4)
    for i, e in enumerate(events):  # each from a Kafka record, some delivered twice
        e.metadata.update(chain(i))
    append(app.store, events)
    append(app.store, [events[i] for i in range(0, 400, 7)])  # re-delivered: dropped
    run_until_caught_up(app)
    ref = count_windows(inputs(app)[:400], MINUTE, LATENESS, LATENESS)
    late = sorted({p for p, *_ in ref.late})
    counts = agg.window_counts()
    assert counts["duplicate"] == len(range(0, 400, 7))
    assert counts["late"] == len(late) > 0
    assert counts["folded"] + counts["late"] + counts["duplicate"] == 400 + counts["duplicate"]
    listed = agg.late_events()
    keys = {e.data["robot"] for e in events}
    windows = {(k, w.start_us): w for k in keys for w in agg.windows(k)}
    if mode == "count":
        assert listed == []
    else:
        assert [x.position for x in listed] == late
        assert all(x.amended == (mode == "amend") for x in listed)
        first = listed[0]
        assert first.windows and first.t_us == ref.late[0][2] or first.windows
    folded = sum(w.value["ok"] + w.value["failed"] for w in windows.values())
    if mode == "amend":  # every input is in its window, late ones as revisions
        assert folded == 400
        revisions = {}
        for _, k, s, _ in ref.late:
            revisions[(k, s)] = revisions.get((k, s), 0) + 1
        for (k, s), n in revisions.items():
            opened = any(key == k and start == s for key, start, _ in ref.counts)
            assert windows[(k, s)].revision == (n if opened else n - 1)
    else:
        assert folded == 400 - len(late)


def test_one_future_stamped_event_does_not_make_honest_ones_late(store_url: str) -> None:
    app = el.App(store_url)
    agg = app.aggregation(
        "seen", key="robot", fields={"n": el.count()}, on="Seen", window=el.tumbling("1m"),
        time=el.event_time("at"), lateness="2m", max_future="30s", persist_every=0.05,
    )  # fmt: skip
    now = datetime.now(UTC).replace(microsecond=0)
    stamp = lambda dt: dt.isoformat()  # noqa: E731
    from datetime import timedelta

    app.store.append("a", [E("Seen", {"robot": "bad", "at": stamp(now + timedelta(days=1))})])
    app.store.append("b", [E("Seen", {"robot": "r", "at": stamp(now - timedelta(seconds=5 - i))})
                           for i in range(10)])  # fmt: skip
    run_until_caught_up(app)
    assert agg.window_counts() == {"folded": 11, "late": 0, "clamped": 1, "duplicate": 0}
    assert sum(w.value["n"] for w in agg.windows("r")) == 10
    (bad,) = agg.windows("bad")  # clamped to recorded_at + 30 s: its window is that one
    assert bad.start <= now + timedelta(minutes=1)


def test_a_key_clock_lets_a_lagging_device_be_on_time(store_url: str) -> None:
    """One robot uploads an hour behind the others: by the store's clock all its attempts are
    late; by its own clock none are."""
    app = el.App(store_url)
    store_agg = define(app, "store_clock", 2)
    key_agg = define(app, "key_clock", 2, clock="key")
    events = []
    base = BASE_MS - BASE_MS % 60_000  # on a minute
    for i in range(120):
        events.append(E("ScrewAttempted", {"robot": "fast", "ok": True, "ts": base + i * 1000}))
        events.append(E("ScrewAttempted", {"robot": "slow", "ok": True,
                                           "ts": base - 3_600_000 + i * 1000}))  # fmt: skip
    append(app.store, events)
    run_until_caught_up(app)
    assert store_agg.window_counts()["late"] == 120  # behind the fast robot's time, each one
    assert key_agg.window_counts() == {"folded": 240, "late": 0, "clamped": 0, "duplicate": 0}
    slow = key_agg.windows("slow")
    assert [w.value["ok"] for w in slow] == [60, 60] and slow[0].final and not slow[1].final
    since = datetime.fromtimestamp((base - 3_600_000) / 1000 + 60, UTC)
    assert [w.start for w in key_agg.windows("slow", since=since)] == [since]


def test_retain_zero_keeps_no_closed_window(store_url: str) -> None:
    app = el.App(store_url)
    agg = define(app, "screws", 2, retain="0s")
    events = [E("ScrewAttempted", {"robot": f"r{i % 3}", "ok": True, "ts": BASE_MS + i * 1000})
              for i in range(600)]  # fmt: skip
    append(app.store, events)
    run_until_caught_up(app)
    kept = [w for k in ("r0", "r1", "r2") for w in agg.windows(k)]
    assert kept and all(not w.final for w in kept)  # the open ones, at the clock's end
    last = (BASE_MS + 599_000) * 1000
    mark = last - LATENESS  # windows ending after it are open
    times = [(BASE_MS + i * 1000) * 1000 for i in range(600)]
    assert {w.start_us for w in kept} == {MINUTE.windows(t)[0][0] for t in times if t >= mark}


def test_a_changed_window_needs_a_new_version(store_url: str) -> None:
    app = el.App(store_url)
    define(app, "screws", 2)
    append(app.store, attempts(50, seed=5))
    run_until_caught_up(app)
    again = el.App(store_url)
    changed = again.aggregation(
        "screws", key="robot", initial=lambda: {"ok": 0, "failed": 0}, window=el.tumbling("5m"),
        time=el.event_time("ts", unit="ms"), lateness="30s", segments=2,
    )  # fmt: skip
    changed.on("ScrewAttempted")(lambda s, e: None)
    with pytest.raises(el.InvalidInputError, match=r"tumbling\(1m.*new version \(version=2\)"):
        run_until_caught_up(again)
    v2 = el.App(store_url)
    agg = v2.aggregation("screws", key="robot", initial=lambda: {"n": 0}, version=2,
                         window=el.tumbling("5m"), time=el.event_time("ts", unit="ms"),
                         lateness="30s")  # fmt: skip
    agg.on("ScrewAttempted")(lambda s, e: s.update(n=s["n"] + 1))
    run_until_caught_up(v2)
    assert sum(w.value["n"] for w in agg.windows("r0")) > 0
    # Retiring version 1 drops its windows, late inputs and clocks with its states.
    old = define(v2, "screws", 2)
    assert old.windows("r0") and old.late_events()
    v2.promote("screws@v2")
    v2.retire("screws")
    assert old.windows("r0") == [] and old.late_events() == []
    assert old.window_counts() == {"folded": 0, "late": 0, "clamped": 0, "duplicate": 0}
    assert agg.windows("r0")  # the new version's stay


def test_bad_window_requests_are_refused_clearly(store_url: str) -> None:
    app = el.App(store_url)
    cases = [
        (dict(window="1m"), "window must be el.tumbling"),
        (dict(window=el.session(gap="5m"), late="amend"), "not available for session windows"),
        (dict(window=el.tumbling("1m"), lateness="soon"), "lateness: expected a duration"),
        (dict(window=el.tumbling("1m"), clock="wall"), "clock must be 'store' or 'key'"),
        (dict(window=el.tumbling("1m"), late="drop"), "late must be one of"),
        (dict(window=el.tumbling("1m"), time="ts"), "time must be el.event_time"),
        (dict(lateness="30s"), "pass window= too"),
        (dict(window=el.tumbling("1m"), max_future="later"), "max_future: expected a duration"),
        (dict(window=el.tumbling("1m"), retain="-1h"), "retain: expected a duration"),
        (dict(window=el.tumbling("1m"), publish="a sink"), "publish= takes an el.KafkaSink"),
        (dict(window=el.tumbling("1m"), sources={"other": store_url}), "windows read one source"),
    ]
    for kwargs, message in cases:
        with pytest.raises(el.InvalidInputError, match=message):
            app.aggregation("x", key="robot", fields={"n": el.count()}, on="S", **kwargs)
    agg = app.aggregation("ok", key="robot", fields={"n": el.count()}, on="S",
                          window=el.tumbling("1m"))  # fmt: skip
    with pytest.raises(el.InvalidInputError, match="is windowed: read its windows"):
        agg.get("r1")
    with pytest.raises(el.InvalidInputError, match="an aware datetime"):
        agg.windows("r1", since=datetime(2026, 1, 1))  # noqa: DTZ001 - the naive one refused


def test_windows_over_upcast_events_are_refused_when_the_app_starts(store_url: str) -> None:
    """The clock reads types as stored: upcast events would be folded but not timed."""
    app = el.App(store_url)
    app.upcaster("Sighted", to="Seen")(lambda e: e.data)  # a legacy type, renamed
    app.aggregation("seen", key="robot", fields={"n": el.count()}, on="Seen",
                    window=el.tumbling("1m"))  # fmt: skip
    with pytest.raises(el.InvalidInputError, match="windows do not read upcast events yet"):
        app.start()
    app.stop()


def test_a_naive_event_time_stops_its_segment_with_a_clear_error(store_url: str) -> None:
    """A time with no offset is never guessed: the segment retries on it (an aggregation's
    on_error), its error names the event, and its token stays before it."""
    app = el.App(store_url)
    agg = app.aggregation(
        "seen", key="robot", fields={"n": el.count()}, on="Seen", window=el.tumbling("1m"),
        time=el.event_time("at"), persist_every=0.05,
    )  # fmt: skip
    app.store.append("a", [E("Seen", {"robot": "r", "at": "2026-11-29T10:00:01Z"})])
    (naive,) = app.store.append("a", [E("Seen", {"robot": "r", "at": "2026-11-29T10:00:02"})])
    app.store.append("a", [E("Seen", {"robot": "r", "at": "2026-11-29T10:00:03Z"})])
    app.start()
    try:
        wait_for(lambda: app.status("seen").segments[0].last_error is not None, 30, what="error")
    finally:
        app.stop()
    (seg,) = app.status("seen").segments
    assert f"event {naive} (Seen)" in seg.last_error and "no offset" in seg.last_error
    assert seg.position < naive
    assert agg.windows("r") == []  # its batch is retried whole: nothing of it written


def test_the_clock_answers_every_segment_exactly_while_others_trim_and_rebase(
    tmp_path: Path,
) -> None:
    """Segments on threads of their own (the tracking mode) ask the shared clock about their
    batches while others move on, trim what is below them all, and start again from below
    (a claim taken at an older token): every answer equals the largest time of the log's
    prefix, never what another segment's trim left."""
    import threading

    from eventlanes.processing.windowing.clock import StoreClock
    from eventlanes.windows.spec import windowing

    app = el.App(f"sqlite:///{tmp_path}/clock.db")
    rng = random.Random(8)
    app.store.append("s", [E("T", {"ts": BASE_MS + rng.randrange(600_000)}) for _ in range(2000)])
    times = {e.position: e.data["ts"] * 1000 for e in app.store.iter_events()}
    prefix, running = {0: None}, None
    for p in sorted(times):
        running = times[p] if running is None else max(running, times[p])
        prefix[p] = running
    spec = windowing("w", el.tumbling("1m"), el.event_time("ts", unit="ms"), max_future="1000d")
    clock = StoreClock(app.store, frozenset({"T"}), spec, lambda position: (0, None))
    wrong: list[str] = []

    def segment(seg: int) -> None:
        r = random.Random(seg)
        for _ in range(4):
            after = r.randrange(0, 1500)  # a claim: from some token, maybe below the others
            while after < 2000:
                upto = min(2000, after + r.randrange(1, 120))
                positions = list(range(after + 1, upto + 1))
                got = clock.before(seg, after, upto, positions)
                want = [prefix[p - 1] for p in positions]
                if got != want:
                    wrong.append(f"segment {seg} at {after}: {got[:3]} != {want[:3]}")
                    return
                latest = clock.at(upto)
                if latest != prefix[upto]:
                    wrong.append(f"segment {seg}: clock at {upto} is {latest}")
                    return
                after = upto
                clock.trim()
            clock.forget(seg)

    threads = [threading.Thread(target=segment, args=(seg,)) for seg in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("late", ["park", "amend"])
def test_declared_fields_fold_into_windows_as_a_python_fold_does(store_url: str, late: str) -> None:
    """Declared fields fold a column at a time (amendments after what came before them in
    the batch): every field, first and last included, equals a Python fold's, for 1 and 3
    segments."""
    app = el.App(store_url)
    fields = {"n": el.count(), "ok": el.count(where={"ok": True}), "sum": el.sum("ts"),
              "min": el.min("ts"), "max": el.max("ts"), "first": el.first("robot"),
              "last": el.last("ts", int)}  # fmt: skip
    declared = {
        n: app.aggregation(f"declared{n}", key="robot", on="ScrewAttempted", fields=fields,
                           window=el.hopping("2m", every="1m"), time=el.event_time("ts", "ms"),
                           lateness="30s", late=late, segments=n, persist_every=0.05)
        for n in (1, 3)
    }  # fmt: skip
    python = app.aggregation(
        "python", key="robot", window=el.hopping("2m", every="1m"), lateness="30s", late=late,
        time=el.event_time("ts", "ms"), persist_every=0.05,
        initial=lambda: {"n": 0, "ok": 0, "sum": 0, "min": None, "max": None, "first": None,
                         "last": None},
    )  # fmt: skip

    @python.on("ScrewAttempted")
    def add(s: dict, e: el.Event) -> None:
        ts = e.data["ts"]
        s["n"] += 1
        s["ok"] += e.data["ok"] is True
        s["sum"] += ts
        s["min"] = ts if s["min"] is None else min(s["min"], ts)
        s["max"] = ts if s["max"] is None else max(s["max"], ts)
        s["first"] = e.data["robot"] if s["first"] is None else s["first"]
        s["last"] = ts

    append(app.store, attempts(800, seed=9))
    run_until_caught_up(app)
    keys = {f"r{i}" for i in range(6)}
    want = {(k, w.start_us): (w.value, w.revision) for k in keys for w in python.windows(k)}
    assert want and any(rev for _, rev in want.values()) == (late == "amend")
    for n, agg in declared.items():
        assert {(k, w.start_us): (w.value, w.revision) for k in keys
                for w in agg.windows(k)} == want, n  # fmt: skip


def test_status_counts_every_input_and_names_the_wait_for_time(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caught up with windows open (no later input came), status says what would close them;
    its counts add up to every input read."""
    import json

    from click.testing import CliRunner

    from eventlanes.cli import main

    monkeypatch.setenv("EVENTLANES_TEST_APP_URL", store_url)
    monkeypatch.delitem(sys.modules, "tests.apps.windows_app", raising=False)
    app = el.App(store_url)
    agg = define(app, "screws", 3)
    events = attempts(300, seed=10)
    for i, e in enumerate(events):
        e.metadata.update(chain(i))
    append(app.store, events)
    append(app.store, events[:20])  # delivered twice
    run_until_caught_up(app)
    result = CliRunner().invoke(main, ["status", "tests.apps.windows_app:app", "screws", "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.stdout)["processors"]
    w = doc["windows"]
    assert {k: w[k] for k in ("folded", "late", "duplicate", "clamped")} == {**agg.window_counts()}
    assert w["folded"] + w["late"] + w["duplicate"] == 320 and w["duplicate"] == 20
    open_ = [x for k in {e.data["robot"] for e in events} for x in agg.windows(k) if not x.final]
    assert w["open"] == len(open_) > 0 and w["oldest_end_us"] == min(x.end_us for x in open_)
    assert w["clock_us"] == max(e.data["ts"] for e in events) * 1000
    (waiting,) = [n for n in doc["notes"] if n.startswith("waiting for time")]
    needed = as_datetime(w["oldest_end_us"] + LATENESS).isoformat()
    assert f"{len(open_)} window(s) open" in waiting and needed in waiting
    assert any(n.startswith(f"windows: {w['folded']:,} input(s) folded") for n in doc["notes"])


def test_a_reset_rebuilds_a_windowed_aggregation_from_the_start(tmp_path) -> None:
    """A reset to the start clears the windows, late inputs, clock rows, entries and the
    stages' states, so the replay folds them again (a fold changed in between is seen);
    before, the replayed inputs met the old windows (dropped as duplicates, or with an
    on_reset clearing the entries, folded in a second time) and the counts doubled. A
    reset to another position keeps the windows (its replayed inputs are duplicates, a
    warning says so), and is refused with on_reset handlers, which may clear the states."""
    url = f"sqlite:///{tmp_path}/w.db"
    step = {"n": 1}

    def build(app: el.App) -> tuple[el.Aggregation, Any]:
        agg = app.aggregation("spm", key="robot", initial=lambda: {"n": 0},
                              window=el.tumbling("1m"), time=el.event_time("ts", unit="ms"),
                              lateness="0s")  # fmt: skip
        minutes = agg.downstream("minutes", key=lambda e: "all", initial=lambda: {"n": 0})

        @agg.on("A")
        def add(state: dict, event: el.Event) -> None:
            state["n"] += step["n"]

        @minutes.on("WindowResult")
        def count(state: dict, event: el.Event) -> None:
            state["n"] += event.data["value"]["n"]

        return agg, minutes

    app = el.App(url)
    agg, minutes = build(app)
    ts = [5, 10, 65, 125, 30, 200]  # seconds: the fifth is late
    app.store.append("c", [E("A", {"robot": "r", "ts": BASE_MS + s * 1000}) for s in ts])
    run_until_caught_up(app)
    first = ([(w.start_us, w.value, w.final) for w in agg.windows("r")], agg.window_counts(),
             [x.position for x in agg.late_events()], minutes.get("all"))  # fmt: skip
    assert first[1]["late"] == 1 and first[3] == {"n": 4}
    [kept] = app.reset_plan("spm", 3).warnings
    assert "keeps its windows" in kept and "3 replayed event(s) are dropped" in kept
    app.reset("spm", 3)
    run_until_caught_up(app)
    assert [(w.start_us, w.value, w.final) for w in agg.windows("r")] == first[0]
    agg.on_reset(lambda ctx: None)
    with pytest.raises(el.InvalidInputError, match="rebuilt from the start: reset it to 'tail'"):
        app.reset("spm", 3)
    assert app.reset_plan("spm", "tail").warnings == []
    app.reset("spm", "tail")
    run_until_caught_up(app)
    again = ([(w.start_us, w.value, w.final) for w in agg.windows("r")], agg.window_counts(),
             [x.position for x in agg.late_events()], minutes.get("all"))  # fmt: skip
    assert again == first
    step["n"] = 10  # the fold changed: a reset builds the windows with it
    app.reset("spm", "tail")
    run_until_caught_up(app)
    assert [w.value for w in agg.windows("r")] == [{"n": 10 * w[1]["n"]} for w in first[0]]
    assert minutes.get("all") == {"n": 40} and agg.window_counts() == first[1]
    app.close()


def test_adding_or_removing_a_window_is_refused_as_a_new_version(tmp_path) -> None:
    """An aggregation that ran without windows, defined again with ``window=`` (or the other
    way round): before, it started, folded only the events after its token into windows (or
    into states without those the windows had), and said nothing. Now refused at start, as
    another window is: a new version."""
    url = f"sqlite:///{tmp_path}/w.db"
    first = el.App(url)
    first.aggregation("w", key="robot", on="A", fields={"n": el.count()})
    first.store.append("c", [E("A", {"robot": "r", "ts": BASE_MS + i}) for i in range(5)])
    run_until_caught_up(first)
    first.close()
    windowed = el.App(url)
    windowed.aggregation("w", key="robot", on="A", fields={"n": el.count()},
                         window=el.tumbling("1m"), time=el.event_time("ts", unit="ms"))  # fmt: skip
    with pytest.raises(el.InvalidInputError, match=r"'w' ran without windows.*version=2"):
        windowed.start(["w"])
    windowed.close()
    other = f"sqlite:///{tmp_path}/v.db"
    second = el.App(other)
    second.aggregation("v", key="robot", on="A", fields={"n": el.count()},
                       window=el.tumbling("1m"), time=el.event_time("ts", unit="ms"))  # fmt: skip
    second.store.append("c", [E("A", {"robot": "r", "ts": BASE_MS + i}) for i in range(5)])
    run_until_caught_up(second)
    second.close()
    plain = el.App(other)
    plain.aggregation("v", key="robot", on="A", fields={"n": el.count()})
    with pytest.raises(el.InvalidInputError, match=r"'v' ran with windows.*version=2"):
        plain.start(["v"])
    plain.close()


def test_status_of_windows_on_each_keys_clock_says_what_closes_them(tmp_path) -> None:
    """With ``clock="key"``, status said the clock was at "no time yet" after inputs were
    read, and that the oldest window closes when any input reaches its end: only its own
    key's can. Now the note says whose input it waits for, and no store clock."""
    from eventlanes.admin.health import MaxLag, processor_document, store_first_after

    app = el.App(f"sqlite:///{tmp_path}/k.db")
    app.aggregation("w", key="r", on="A", fields={"n": el.count()}, window=el.tumbling("1m"),
                    time=el.event_time("at", unit="s"), lateness="10s", clock="key")  # fmt: skip
    app.store.append("s", [E("A", {"r": r, "at": t})
                           for r, t in [("x", 0), ("x", 70), ("x", 200), ("y", 5)]])  # fmt: skip
    run_until_caught_up(app)
    doc = processor_document(app.status("w"), store_first_after(app.store), MaxLag())
    assert doc["windows"]["clock"] == "key" and doc["windows"]["clock_us"] is None
    waiting = [n for n in doc["notes"] if n.startswith("waiting for time")]
    assert waiting and "an input of its own key" in waiting[0], doc["notes"]
    assert "no time yet" not in waiting[0]
    app.close()
