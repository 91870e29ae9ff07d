"""Idle time as an event (issue 33): with ``idle_close=`` a windowed aggregation's workers
append a tick once no input came for that long, so the windows its last inputs left open
close; the ticks are in the log, so a later build closes them at the same positions. Without
it, windows wait for time (and status says so)."""

from __future__ import annotations

import threading

import pytest

import eventlanes as el
from eventlanes.processing.windowing.clock import StoreClock, recorded_us
from eventlanes.processing.windowing.ticker import Ticker
from eventlanes.windows.kinds import Tumbling
from eventlanes.windows.reference import count_windows
from eventlanes.windows.spec import windowing
from tests.processing_helpers import run_until_caught_up, wait_for

E = el.NewEvent
SECOND = Tumbling(1_000_000)


def counted(app: el.App, name: str, **window: object) -> el.Aggregation:
    return app.aggregation(
        name, key="robot", on="ScrewAttempted", fields={"n": el.count()},
        window=el.tumbling("1s"), **window,  # type: ignore[arg-type]
    )  # fmt: skip


def closes(app: el.App, name: str) -> list[tuple[int, str, int, int]]:
    """(closing position, key, start, end) of the closed windows, as written."""
    table = app.runtime.windows
    rows = table.db.query(
        table.db.sql(
            f"SELECT closed_at, key, start_us, end_us FROM {table.states} "
            "WHERE aggregation = ? AND closed_at IS NOT NULL"
        ),
        (name,),
    )
    return sorted(tuple(r) for r in rows)


def test_windows_close_when_inputs_stop_and_a_later_build_closes_them_alike(
    store_url: str,
) -> None:
    app = el.App(store_url)
    ticked = counted(app, "ticked", idle_close="300ms")
    quiet = counted(app, "quiet")  # no ticks: its last window waits for time
    app.store.append("cell-1", [E("ScrewAttempted", {"robot": r}) for r in "aab"])
    app.start()
    try:
        wait_for(
            lambda: ticked.windows("a") and all(w.final for w in ticked.windows("a")),
            timeout=30, what="the windows closed by a tick",
        )  # fmt: skip
        wait_for(lambda: ticked.windows("b") and all(w.final for w in ticked.windows("b")),
                 timeout=30, what="every window closed")  # fmt: skip
        threading.Event().wait(1.0)
        count = app.store.stream_version("$clock")
        threading.Event().wait(1.5)  # five idle_close: nothing left to close, no tick
        assert app.store.stream_version("$clock") == count
    finally:
        app.stop()
    ticks = [e for e in app.store.iter_events() if e.type == el.TICK]
    assert ticks and all(e.stream_id == "$clock" for e in ticks)
    assert [(w.value, w.final) for w in quiet.windows("a")] == [({"n": 2}, False)]
    assert [(w.value, w.final) for w in ticked.windows("a")] == [({"n": 2}, True)]
    assert [(w.value, w.final) for w in ticked.windows("b")] == [({"n": 1}, True)]
    # each closed at the tick that passed its end, as the reference loop over the log says
    inputs: list[tuple[int, str | None, int, int]] = [
        (e.position, None if e.type == el.TICK else e.data["robot"], recorded_us(e), recorded_us(e))
        for e in app.store.iter_events()
    ]
    want = count_windows(inputs, SECOND, 0, 0).closes
    assert want and closes(app, "ticked") == sorted(want)
    assert {p for p, *_ in want} <= {e.position for e in ticks}
    # a new aggregation built later over the same log (its own ticks far off) closes alike
    again = el.App(store_url)
    built = counted(again, "built", idle_close="1h")
    run_until_caught_up(again)
    assert closes(again, "built") == closes(app, "ticked")
    assert built.windows("a") == ticked.windows("a")


def test_a_restarted_worker_that_reads_only_ticks_closes_the_windows_left_open(
    store_url: str,
) -> None:
    first = el.App(store_url)
    agg = counted(first, "screws", idle_close="1h")  # no tick while it runs
    first.store.append("cell-1", [E("ScrewAttempted", {"robot": "a"})])
    run_until_caught_up(first)
    assert [w.final for w in agg.windows("a")] == [False]
    again = el.App(store_url)
    agg = counted(again, "screws", idle_close="200ms")  # the same definition: ticks are read
    again.start()
    try:
        wait_for(lambda: [w.final for w in agg.windows("a")] == [True], timeout=30,
                 what="the window left open closed by a tick")  # fmt: skip
    finally:
        again.stop()
    assert [w.value for w in agg.windows("a")] == [{"n": 1}]


def test_handlers_of_every_type_are_never_given_a_tick(store_url: str) -> None:
    app = el.App(store_url)
    seen: list[str] = []
    batches: list[str] = []
    proj = app.processor("everything")
    proj.on_any(lambda event, ctx: seen.append(event.type))
    batch = app.processor("batches")
    batch.on_batch()(lambda events, ctx: batches.extend(e.type for e in events))
    agg = app.aggregation("any", key=lambda e: e.data.get("robot", "none"), initial=dict)
    agg.on_any(lambda state, event: state.__setitem__(event.type, state.get(event.type, 0) + 1))
    ticks = app.aggregation("ticks", key=lambda e: e.stream_id, initial=dict)  # by name: given
    ticks.on(el.TICK)(lambda state, event: state.__setitem__("n", state.get("n", 0) + 1))
    app.store.append("cell", [E("ScrewAttempted", {"robot": "r"})])
    app.store.append("$clock", [E(el.TICK, {})])
    app.store.append("cell", [E("ScrewAttempted", {"robot": "r"})])
    run_until_caught_up(app)
    assert seen == batches == ["ScrewAttempted", "ScrewAttempted"]
    assert agg.get("r") == {"ScrewAttempted": 2} and agg.get("none") is None
    assert ticks.get("$clock") == {"n": 1}


def test_workers_that_find_the_store_quiet_at_once_append_one_tick(
    store: el.EventStore,
) -> None:
    """Each worker appends at the tick stream's version it read: of four that read it before
    any appended, one appends; a tick they are told of starts a new quiet spell."""
    tickers = [Ticker(store, 50_000, "agg") for _ in range(4)]
    for spell in range(1, 3):
        versions = [store.stream_version("$clock") for _ in tickers]
        start = threading.Barrier(len(tickers))
        appended: list[bool] = []

        def tick(t: Ticker, version: int, start: threading.Barrier, out: list[bool]) -> None:
            start.wait()
            out.append(t.append(version))

        threads = [
            threading.Thread(target=tick, args=(t, v, start, appended))
            for t, v in zip(tickers, versions, strict=True)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(appended) == [False, False, False, True]
        assert store.stream_version("$clock") == spell
    assert [e.type for e in store.iter_events()] == [el.TICK, el.TICK]
    quiet = tickers[0]
    quiet.heard()
    quiet.check()  # heard just now: not quiet for 50 ms yet
    assert store.stream_version("$clock") == 2
    threading.Event().wait(0.06)
    quiet.check()
    assert store.stream_version("$clock") == 3


def test_the_clock_takes_a_tick_at_its_recorded_time_less_the_lag(store: el.EventStore) -> None:
    """Read from the table and fed a reader's batch alike; without ticks, passed over."""
    spec = windowing(
        "a", el.tumbling("1s"), time=el.event_time("at", unit="us"), idle_close="1s",
        tick_lag="2s",
    )  # fmt: skip
    store.append("cell", [E("ScrewAttempted", {"robot": "r", "at": 5})])
    store.append("$clock", [E(el.TICK, {})])
    store.append("cell", [E("ScrewAttempted", {"robot": "r", "at": 7})])
    events = list(store.iter_events())
    want = recorded_us(events[1]) - 2_000_000
    types = frozenset({"ScrewAttempted", el.TICK})
    assert spec is not None
    scanned = StoreClock(store, types, spec, lambda position: (0, None))
    assert [scanned.at(p) for p in (1, 2, 3)] == [5, want, want]
    fed = StoreClock(store, types, spec, lambda position: (0, None))
    fed.cover(0, 0, 0)
    fed.feed(events, 0, 3)
    assert fed.scanned == 3 and [fed.at(p) for p in (1, 2, 3)] == [5, want, want]
    plain = windowing("a", el.tumbling("1s"), time=el.event_time("at", unit="us"))
    assert plain is not None
    unticked = StoreClock(store, frozenset({"ScrewAttempted"}), plain, lambda p: (0, None))
    assert [unticked.at(p) for p in (1, 2, 3)] == [5, 5, 7]


def test_tick_options_are_checked(store_url: str) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match="idle_close is not available there yet"):
        counted(app, "key", idle_close="1m", clock="key")
    with pytest.raises(el.InvalidInputError, match="tick_lag says how ticks are read"):
        counted(app, "lag", tick_lag="5s")
    with pytest.raises(el.InvalidInputError, match="idle_close: '0s' must be more than zero"):
        counted(app, "zero", idle_close="0s")
    with pytest.raises(el.InvalidInputError, match="idle_close: expected a duration"):
        counted(app, "bare", idle_close=60)
    with pytest.raises(el.InvalidInputError, match="pass window= too"):
        app.aggregation("plain", key="robot", fields={"n": el.count()}, idle_close="1m")
    # whether ticks are read, and their lag, change what is folded: a new version
    base = windowing("a", el.tumbling("1s"))
    with_ticks = windowing("a", el.tumbling("1s"), idle_close="1m")
    lagged = windowing("a", el.tumbling("1s"), idle_close="1m", tick_lag="5s")
    other_idle = windowing("a", el.tumbling("1s"), idle_close="2m")
    assert base and with_ticks and lagged and other_idle
    assert len({base.definition(), with_ticks.definition(), lagged.definition()}) == 3
    assert other_idle.definition() == with_ticks.definition()
