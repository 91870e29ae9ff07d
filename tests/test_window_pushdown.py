"""Windows folded inside SQLite (issue 33): a declared windowed aggregation over ranges folded
by one statement each writes exactly what the row path writes (windows with the positions
that closed them, late inputs, the clock rows and counts, the keys' offsets), whatever the
ranges, and a range it cannot fold exactly takes the row path."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from time import sleep
from time import time as wall
from typing import Any

import pytest

import eventlanes as el
from eventlanes.processing.aggregating.pushdown import base as pushdown
from eventlanes.processing.tables.windows import Checkpoint, WindowTable
from eventlanes.processing.windowing.clock import StoreClock
from eventlanes.processing.windowing.pushdown import window_pushdown
from tests.processing_helpers import run_until_caught_up

BASE_MS = 1_700_000_000_000
FIELDS = {
    "n": el.count(), "ok": el.count(where={"ok": True}), "sum": el.sum("v"), "min": el.min("v"),
    "max": el.max("v"), "first": el.first("robot"), "last": el.last("v", int),
}  # fmt: skip
WINDOWS = {  # by the robots' clocks (ms); by recorded_at: a thousand times shorter
    "tumbling": lambda scale: el.tumbling(f"60{scale}", offset=f"7{scale}"),
    "hopping": lambda scale: el.hopping(f"180{scale}", every=f"60{scale}", offset=f"7{scale}"),
}


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of a few hundred positions: many of them, cut anywhere in the data."""
    monkeypatch.setattr(pushdown, "SPAN", 137)
    monkeypatch.setattr(pushdown, "TEXT_SPAN", 50)


def define(app: el.App, window: str, late: str = "park", time: Any = "ts") -> None:
    """The same aggregation folded in SQLite ("push") and by rows ("rows")."""
    kw: dict[str, Any] = {"time": el.event_time("ts", unit="ms")} if time == "ts" else {}
    scale = "s" if time == "ts" else "ms"
    for name in ("push", "rows"):
        app.aggregation(
            name, key="robot", on="Attempt", fields=FIELDS, window=WINDOWS[window](scale),
            lateness=f"20{scale}", late=late, persist_every=0.05, batch_size=50,
            pushdown=name == "push", **kw,
        )  # fmt: skip


def attempts(n: int, seed: int, start_ms: int = BASE_MS, future: float = 0.0) -> list[Any]:
    """0.7 s apart, up to a minute out of order (many late), ``future`` of them 5 minutes
    ahead (clamped where that is past ``recorded_at``)."""
    rng = random.Random(seed)
    return [
        el.NewEvent("Attempt", {
            "robot": f"r{rng.randrange(7)}", "ok": rng.random() < 0.7, "v": rng.randrange(-50, 99),
            "ts": start_ms + i * 700 - rng.randrange(60_000)
            + (300_000 if rng.random() < future else 0),
        })
        for i in range(n)
    ]  # fmt: skip


def append(store: el.EventStore, events: list[Any], pause: float = 0.0) -> None:
    for i in range(0, len(events), 30):
        store.append(f"cell-{i // 30 % 5}", events[i : i + 30])
        sleep(pause)  # recorded_at moves on: windows of milliseconds close


def written(path: Path, name: str) -> dict[str, list[Any]]:
    """Every row the aggregation wrote but the time it wrote it: windows (with the position
    that closed each), late inputs, clock rows, keys with their offsets."""
    conn = sqlite3.connect(path)
    try:
        found = {}
        for table in ("el_window_states", "el_window_late", "el_window_clocks", "el_aggregates"):
            columns = [c[1] for c in conn.execute(f"PRAGMA table_info({table})")]
            kept = ", ".join(c for c in columns if c not in ("aggregation", "updated_at"))
            sql = f"SELECT {kept} FROM {table} WHERE aggregation = ?"
            found[table] = sorted(conn.execute(sql, (name,)).fetchall())
        return found
    finally:
        conn.close()


def aggregation(app: el.App, name: str = "push") -> el.Aggregation:
    agg = app.get(name)
    assert isinstance(agg, el.Aggregation)
    return agg


def pushed(app: el.App) -> int:
    return aggregation(app).pushed_down


def assert_same(path: Path, app: el.App) -> dict[str, list[Any]]:
    want = written(path, "rows")
    assert written(path, "push") == want
    assert aggregation(app).window_counts() == aggregation(app, "rows").window_counts()
    return want


@pytest.mark.parametrize(
    ("window", "late", "time"),
    [("tumbling", "park", "ts"), ("hopping", "park", "ts"), ("hopping", "count", "ts"),
     ("tumbling", "park", None), ("hopping", "count", None)],
)  # fmt: skip
def test_windows_folded_in_sqlite_equal_the_row_path(
    tmp_path: Path, window: str, late: str, time: str | None
) -> None:
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, window, late, time)
    append(app.store, attempts(1500, seed=1), pause=0.0 if time == "ts" else 0.005)
    run_until_caught_up(app)
    want = assert_same(path, app)
    assert want["el_window_states"] and pushed(app) == 1500
    closed = [row for row in want["el_window_states"] if row[5] is not None]
    assert closed  # closed at the positions the clock passed them, compared above
    if time == "ts":  # by the robots' clocks, many are late; by recorded_at, none
        assert aggregation(app).window_counts()["late"] > 100
        assert bool(want["el_window_late"]) == (late == "park")


@pytest.mark.parametrize("window", ["tumbling", "hopping"])
def test_inputs_on_the_boundaries_are_late_or_not_alike(tmp_path: Path, window: str) -> None:
    """The clock 20 s past a window's end (its lateness): an input in it is late, one at its
    end is not; one at the clock itself or a microsecond before moves nothing."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, window)
    m0 = BASE_MS - BASE_MS % 60_000 + 7_000  # a window's start, either kind (offset 7 s)
    ts = [m0, m0 + 80_000, m0 + 59_999, m0 + 60_000, m0 + 80_000, m0 + 79_999, m0 + 140_001,
          m0 + 119_999, m0 + 120_000, m0 + 200_000, m0 + 120_000 - 180_000]  # fmt: skip
    for i, t in enumerate(ts):
        row = {"robot": f"r{i % 2}", "ok": True, "v": i, "ts": t}
        app.store.append(f"cell-{i}", [el.NewEvent("Attempt", row)])
    run_until_caught_up(app)
    want = assert_same(path, app)
    assert [row[0] for row in want["el_window_late"]] == [3, 8, 11]
    assert pushed(app) == len(ts)


def test_clamped_future_times_are_counted_alike(tmp_path: Path) -> None:
    """Times ahead of ``recorded_at`` by more than ``max_future`` are clamped, in SQL too."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, "hopping")
    now_ms = int(wall() * 1000)
    append(app.store, attempts(900, seed=3, start_ms=now_ms - 600_000, future=0.05))
    run_until_caught_up(app)
    assert_same(path, app)
    counts = aggregation(app).window_counts()
    assert counts["clamped"] > 10 and pushed(app) == 900


def test_a_range_it_cannot_fold_exactly_takes_the_row_path(tmp_path: Path) -> None:
    """A source chain, a time that is not a whole number and an amendment (``late="amend"``,
    folded into a closed window by rows): those ranges by rows, the others in SQLite."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, "tumbling")
    events = attempts(1200, seed=5)
    events[300] = el.NewEvent("Attempt", {**events[300].data, "ts": events[300].data["ts"] + 0.5})
    append(app.store, events[:600])
    hop = {"source": "up", "partition": "", "offset": 7, "out": 0}
    chained = el.NewEvent("Attempt", events[600].data, metadata={"source_chain": [hop]})
    app.store.append("cell-9", [chained, chained])  # republished twice: one is a duplicate
    append(app.store, events[601:])
    run_until_caught_up(app)
    assert_same(path, app)
    assert aggregation(app).window_counts()["duplicate"] == 1
    assert 0 < pushed(app) < 1200 - 137


def test_amendments_take_the_row_path_and_the_rest_is_folded_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, "tumbling", late="amend")
    on_time = attempts(600, seed=6)
    for i, e in enumerate(on_time):
        e.data["ts"] = BASE_MS + 700 * i  # in order: nothing late
    append(app.store, on_time + attempts(600, seed=7, start_ms=BASE_MS + 420_000))
    run_until_caught_up(app)
    want = assert_same(path, app)
    assert any(row[6] for row in want["el_window_states"])  # revised windows
    assert 400 < pushed(app) < 1200


def test_a_replay_over_folded_inputs_reads_its_clock_again(tmp_path: Path) -> None:
    """After a reset the keys' offsets are past the token: the replayed ranges are folded by
    rows (inputs dropped as duplicates), whose clock is read again input by input: a range
    from before the old head to after it holds new inputs, late or not by that clock."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}", claim_timeout=5)
    define(app, "hopping")
    append(app.store, attempts(900, seed=8))
    run_until_caught_up(app)
    for name in ("push", "rows"):
        app.reset(name, to=820)  # the first range read: (820, 957]
    append(app.store, attempts(600, seed=9, start_ms=BASE_MS + 560_000))
    run_until_caught_up(app)
    assert_same(path, app)
    counts = aggregation(app).window_counts()
    assert counts["duplicate"] == 80 and pushed(app) > 400


def test_what_it_is_not_taken_for(tmp_path: Path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/w.db")
    kinds = {
        "session": {"window": el.session("1m")},
        "key clock": {"window": el.tumbling("1m"), "clock": "key"},
        "ticks": {"window": el.tumbling("1m"), "idle_close": "5s"},
        "iso time": {"window": el.tumbling("1m"), "time": el.event_time("at")},
        "uneven hops": {"window": el.hopping("150s", every="1m")},
        "too many hops": {"window": el.hopping("1h", every="10s")},
        "taken": {"window": el.hopping("1h", every="1m")},
    }
    taken = {}
    for name, kw in kinds.items():
        fields = {"n": el.count()}
        agg = app.aggregation(name.replace(" ", "_"), key="robot", on="Attempt", fields=fields,
                              **kw)  # fmt: skip
        spec = agg.windowing  # type: ignore[attr-defined]
        got = window_pushdown(agg.declaration, [app.store], True, spec,  # type: ignore[attr-defined]
                              agg.read_types(), None, lambda p: None)  # fmt: skip
        taken[name] = got is not None
    assert taken == {name: name == "taken" for name in kinds}


@pytest.mark.parametrize("window", ["tumbling", "hopping"])
def test_the_clock_fed_a_ranges_breaks_answers_as_if_it_read_every_input(
    tmp_path: Path, window: str
) -> None:
    """Fed only where a range's largest time reaches a closing time (and where it last
    grew), the clock places every closing time as a clock that read each input does; asked
    inside the range (a range folded by rows after all, a token ending there), it reads the
    range again first and answers the same too."""
    app = el.App(f"sqlite:///{tmp_path}/w.db")
    define(app, window)
    append(app.store, attempts(700, seed=11, future=0.02))
    agg = aggregation(app)
    spec, head = agg.windowing, app.store.head()
    assert spec is not None

    def clock() -> StoreClock:
        made = StoreClock(app.store, agg.read_types(), spec, lambda _: (0, None))
        made.at(0)  # known up to the start
        return made

    exact = clock()
    pd = window_pushdown(agg.declaration, [app.store], True, spec, agg.read_types(), None,
                         exact.at)  # fmt: skip
    assert pd is not None
    parts, upto = pd._range(0, head)
    assert upto == head and len(parts[3]) < head // 10  # few breaks kept
    ends = sorted({s + spec.window.size for _, s, *_ in parts[1]})
    closing = [e + spec.lateness for e in ends if e + spec.lateness <= exact.at(head)]
    assert len(closing) > 5
    fed = [clock() for _ in range(3)]
    for c in fed:
        c.feed_breaks(parts[3], 0, head)
    assert fed[0].reached(head, closing) == exact.reached(head, closing)
    assert fed[0].at(head) == exact.at(head)
    positions = list(range(1, head + 1))
    assert fed[1].before(0, 0, head, positions) == exact.before(0, 0, head, positions)
    assert [fed[2].at(p) for p in positions] == [exact.at(p) for p in positions]


@pytest.mark.parametrize("pushdown_on", [True, False], ids=["in SQLite", "by rows"])
def test_a_write_never_leaves_open_a_window_its_clock_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pushdown_on: bool
) -> None:
    """A segment writing at once after each batch (a tracking processor, no conflation)
    closes what the batch's clock passed before it writes: a restart starts its clock at the
    row written, and could not place a window left open below it (the segment would fail on
    every restart)."""
    broken: list[tuple[int, int]] = []
    save = WindowTable.save_checkpoint

    def checked(table: WindowTable, conn: Any, name: str, seg: int, cp: Checkpoint) -> None:
        if cp.latest is not None:
            sql = table.db.sql(
                f"SELECT count(*) FROM {table.states} WHERE aggregation = ? AND closed_at IS "
                "NULL AND end_us + ? <= ?"
            )
            passed = conn.execute(sql, (name, 20_000_000, cp.latest)).fetchone()[0]
            if passed:
                broken.append((cp.position, passed))
        save(table, conn, name, seg, cp)

    monkeypatch.setattr(WindowTable, "save_checkpoint", checked)
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    app.aggregation(
        "w", key="robot", on="Attempt", fields=FIELDS, window=WINDOWS["tumbling"]("s"),
        lateness="20s", persist_every=0, batch_size=40, mode="tracking",
        time=el.event_time("ts", unit="ms"), pushdown=pushdown_on,
    )  # fmt: skip
    append(app.store, attempts(900, seed=12))
    run_until_caught_up(app)
    assert broken == []
    assert (aggregation(app, "w").pushed_down > 0) == pushdown_on


def test_a_window_left_open_below_the_clocks_checkpoint_closes_where_it_did(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store written before closes came first may hold a window left open that its clock
    row had passed: the restarted clock reads the log from its start and closes it at the
    position where the clock passed it, instead of failing the segment on every start."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, "tumbling")
    append(app.store, attempts(900, seed=13))
    run_until_caught_up(app)
    want = written(path, "push")["el_window_states"]
    conn = sqlite3.connect(path)
    with conn:
        reopened = conn.execute(
            "UPDATE el_window_states SET closed_at = NULL WHERE aggregation = 'push' AND "
            "closed_at > (SELECT max(closed_at) - 200 FROM el_window_states)"
        ).rowcount
    conn.close()
    assert reopened > 2
    app = el.App(f"sqlite:///{path}")
    define(app, "tumbling")
    app.store.append("cell-0", [el.NewEvent("Attempt", {"robot": "r1", "ok": True, "v": 1,
                                                        "ts": BASE_MS})])  # fmt: skip
    with caplog.at_level("WARNING", logger="eventlanes.aggregation"):
        run_until_caught_up(app)
    assert "reading the clock from the log's start" in caplog.text
    assert written(path, "push")["el_window_states"] == want  # that input: late, no window


@pytest.mark.parametrize("recorded", ["'soon'", "1.5", str(2**62)])
def test_a_recorded_at_the_statement_cannot_read_exactly_takes_the_row_path(
    tmp_path: Path, recorded: str
) -> None:
    """``recorded_at`` written behind the store's back as text, a float or past the bound:
    the range is not folded in SQLite (the row path reads it, or names the event)."""
    path = tmp_path / "w.db"
    app = el.App(f"sqlite:///{path}")
    define(app, "tumbling", time=None)
    append(app.store, attempts(60, seed=14))
    agg = aggregation(app)
    assert agg.windowing is not None
    pd = window_pushdown(agg.declaration, [app.store], True, agg.windowing, agg.read_types(),
                         None, lambda _: None)  # fmt: skip
    assert pd is not None
    assert pd._range(0, 1000)[0] is not None  # folded in SQLite as written
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"UPDATE el_events SET recorded_at = {recorded} WHERE position = 30")
    conn.close()
    assert pd._range(0, 1000)[0] is None
