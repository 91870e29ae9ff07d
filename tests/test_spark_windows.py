"""Windowed aggregations replayed on Spark (issue 33: both engines, one answer): on the same
store, the windows (values, closes, revisions), the late inputs and the counts equal the local
engine's, and the local engine goes on from where the replay stopped exactly as if it had
folded everything itself."""

from __future__ import annotations

import random
import shutil
import time

import pytest

import eventlanes as el
from tests.processing_helpers import run_until_caught_up

E = el.NewEvent
#: 1969-12-31T23:58:00: windows on both sides of the epoch (floor arithmetic before it)
BASE_MS = -120_000
NOW_MS = int(time.time() * 1000)


def attempts(n: int, seed: int, robots: int = 5, first: int = 0, clamp: int = -1) -> list[E]:
    """A second apart, each robot's clock up to 90 s behind (many late inputs), every one from
    a Kafka record (a source chain), some 5 min ahead; input ``clamp`` stamped hours in the
    future (clamped to its ``recorded_at`` plus an hour: the clock jumps there, what is open
    closes)."""
    rng = random.Random(seed)
    out = []
    for i in range(first, first + n):
        ts = BASE_MS + i * 1000 - rng.randrange(90_000)
        if i == clamp:
            ts = NOW_MS + 3 * 3_600_000
        elif i % 200 == 100:  # a device 5 min ahead: the clock jumps past minutes still to come
            ts += 300_000
        chain = {"source_chain": [{"source": "robots", "partition": 0, "offset": i}]}
        out.append(E("ScrewAttempted", {"robot": f"r{rng.randrange(robots)}",
                                        "ok": rng.random() < 0.8, "ts": ts}, chain))  # fmt: skip
    return out


def recorded(e: el.Event) -> int:
    from eventlanes.processing.windowing.clock import recorded_us

    return recorded_us(e)


def append(store: el.EventStore, events: list[E], per: int = 40) -> None:
    for i in range(0, len(events), per):
        store.append(f"cell-{i // per % 3}", events[i : i + per])


FIELDS = {"n": el.count(), "ok": el.count(where={"ok": True}), "first": el.first("ts", int),
          "last": el.last("ts", int), "min": el.min("ts")}  # fmt: skip
CASES = {
    "tumbling, store clock, kept, Python fold": {"window": el.tumbling("1m")},
    "hopping, store clock, amended, declared": {
        "window": el.hopping("2m", every="30s"), "late": "amend", "fields": FIELDS,
    },
    "tumbling with an offset, key clock, counted, Python fold": {
        "window": el.tumbling("1m", offset="15s"), "clock": "key", "late": "count",
    },
    "tumbling, store clock, amended, retain 1 min, Python fold": {
        "window": el.tumbling("1m"), "late": "amend", "retain": "1m",
    },
    "session, store clock, kept, Python fold": {"window": el.session(gap="40s")},
    "session, key clock, counted, declared": {
        "window": el.session(gap="25s"), "clock": "key", "late": "count",
        "fields": {k: f for k, f in FIELDS.items() if k not in ("first", "last")},
    },
}  # fmt: skip


def define(app: el.App, name: str, case: dict, segments: int) -> el.Aggregation:
    options = {"key": "robot", "time": el.event_time("ts", unit="ms"), "lateness": "20s",
               "max_future": "1h", "retain": "40000d", "segments": segments,
               "persist_every": 0.05, "batch_size": 50, **case}  # fmt: skip
    fields = options.pop("fields", None)
    if fields is not None:
        return app.aggregation(name, on="ScrewAttempted", fields=fields, **options)
    agg = app.aggregation(name, initial=lambda: {"ok": 0, "failed": 0, "seen": []}, **options)

    @agg.on("ScrewAttempted")
    def add(state: dict, event: el.Event) -> None:
        state["ok" if event.data["ok"] else "failed"] += 1
        state["seen"].append(event.position)  # order-sensitive: the fold order shows

    if "session" in case["window"].describe():

        @agg.on_merge
        def merge(into: dict, other: dict) -> None:  # order-sensitive too
            into["ok"] += other["ok"]
            into["failed"] += other["failed"]
            into["seen"] += other["seen"]

    return agg


def results(app: el.App, agg: el.Aggregation, keys: list[str]) -> tuple:
    windows = {k: [(w.start_us, w.end_us, w.value, w.final, w.revision) for w in agg.windows(k)]
               for k in keys}  # fmt: skip
    late = [(x.position, x.key, x.t_us, x.windows, x.amended) for x in agg.late_events()]
    return windows, late, agg.window_counts(), stored(app, agg.name)


def stored(app: el.App, name: str) -> tuple:
    """What users do not see through the API and the local engine reads back: where each
    window closed, each key's entry (dedupe offsets, its clock), the store clock's rows."""
    db = app.db
    rows = [
        db.query(db.sql(f"SELECT {cols} FROM {db.table(t)} WHERE aggregation = ? ORDER BY 1, 2"),
                 (name,))
        for t, cols in [("window_states", "key, start_us, closed_at"),
                        ("aggregates", "key, value, offsets, dropped"),
                        ("window_clocks", "position, latest")]
    ]  # fmt: skip
    rows[2] = sorted(set(rows[2]))  # one row per segment (3 and 2 here): the same clock
    return tuple(map(tuple, rows))


# Every case on SQLite; PostgreSQL (the same plan, its write through the other database) once
@pytest.mark.parametrize(
    ("backend", "case"),
    [*(("sqlite", c) for c in CASES), ("postgres", "hopping, store clock, amended, declared")],
    indirect=["backend"],
)
def test_a_spark_replay_equals_the_local_engine_and_the_local_engine_goes_on(
    spark, store_url: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import eventlanes.spark.staging

    # rows brought to the driver 100 at a time (by hash of the key), as a replay of many keys
    monkeypatch.setattr(eventlanes.spark.staging, "PART", 100)
    app = el.App(store_url)
    local = define(app, "local", CASES[case], segments=3)
    sparked = define(app, "sparked", CASES[case], segments=2)
    events = attempts(600, seed=len(case), clamp=590)
    append(app.store, events)
    append(app.store, [events[i] for i in range(0, 600, 9)])  # re-delivered: duplicates
    result = el.spark.replay(app, "sparked", spark=spark)
    assert result.events == app.store.head()
    run_until_caught_up(app)  # "local" folds it all; "sparked" has nothing left to fold
    keys = [f"r{i}" for i in range(5)]
    want = results(app, local, keys)
    windows, late, counts, _ = want
    # the data has what the comparison is about, or it proves little
    assert counts["duplicate"] == len(range(0, 600, 9)) and counts["clamped"] > 0
    finals = [w[3] for ws in windows.values() for w in ws]
    # closed windows kept, and open ones; with retain="1m", every closed one expired (the
    # clamped input moved the clock hours past them)
    assert counts["late"] > 0 and any(finals) == ("retain" not in CASES[case])
    assert not all(finals)
    if CASES[case].get("late") != "count":
        assert late
    assert results(app, sparked, keys) == want
    # the local engine goes on from the replay's tokens, clock rows and open windows
    more = attempts(300, seed=7, first=600, clamp=850)
    append(app.store, more + [more[i] for i in range(0, 300, 11)] + events[:5])
    run_until_caught_up(app)
    assert results(app, sparked, keys) == results(app, local, keys)
    assert local.window_counts()["folded"] > counts["folded"]


def test_a_session_closes_where_the_clock_first_reaches_its_end_on_spark(spark, tmp_path) -> None:
    """A session closes at the first position whose time reaches its end plus the lateness,
    also when that time is exactly the threshold and ends a range of positions Spark reads
    the clock in (8 events, 4 ranges of 2): as the local engine closes it."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    opts = dict(key="robot", time=el.event_time("ts", unit="ms"), window=el.session(gap="40s"),
                lateness="20s", on="ScrewAttempted", fields={"n": el.count()})  # fmt: skip
    local, sparked = (app.aggregation(n, **opts) for n in ("local", "sparked"))
    seconds = [("a", 0), ("b", 60), ("b", 61), ("c", 62), ("c", 100), ("b", 110), ("a", 111),
               ("c", 200)]  # fmt: skip
    for robot, s in seconds:  # one event per append: positions 1 to 8
        app.store.append(robot, [E("ScrewAttempted", {"robot": robot, "ts": s * 1000})])
    el.spark.replay(app, "sparked", spark=spark, partitions=1)
    run_until_caught_up(app)
    closes = {n: stored(app, n)[0] for n in ("local", "sparked")}
    assert ("a", 0, 2) in closes["local"]  # [0 s, 40 s) closed by the 60 s input, position 2
    assert closes["sparked"] == closes["local"]
    keys = ["a", "b", "c"]
    assert results(app, sparked, keys) == results(app, local, keys)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_replay_feeds_stages_and_on_close_as_the_local_engine(spark, store_url: str) -> None:
    """Closed windows feed a downstream stage (whose own states publish nothing here) and
    ``on_close`` on Spark too: the stage's states (its dropped repeats none) and the events
    ``on_close`` appends are the local engine's on the same store; the stage's old states are
    replaced. Before, a replay refused both."""
    app = el.App(store_url)
    events = attempts(500, seed=31, clamp=490)
    append(app.store, events + events[::9])
    aggs = {}
    for name in ("local", "sparked"):
        case = {**CASES["tumbling, store clock, kept, Python fold"], "retain": "1m"}
        agg = aggs[name] = define(app, name, case, segments=2)
        per_minute = agg.downstream(f"{name}-minutes", key=lambda e: str(e.data["start_us"]),
                                    initial=lambda: {"ok": 0, "windows": 0})  # fmt: skip

        @per_minute.on("WindowResult")
        def add(state: dict, event: el.Event) -> None:
            state["ok"] += event.data["value"]["ok"]
            state["windows"] += 1

        @agg.on_close
        def closed(window: el.WindowResult, name: str = name) -> el.NewEvent:
            return el.NewEvent("MinuteClosed", {"of": name, "start": window.start_us,
                                                "ok": window.value["ok"]})  # fmt: skip

    head = app.store.head()
    with app.db.transaction() as conn:  # a stage state from before: the replay replaces it
        conn.execute(
            app.db.sql(f"INSERT INTO {app.db.table('aggregates')} (aggregation, key, value, "
                       "offsets, dropped, updated_at) VALUES (?, ?, ?, ?, ?, ?)"),
            ("sparked-minutes", "stale", "{}", "{}", 0, 0),
        )  # fmt: skip
    el.spark.replay(app, "sparked", spark=spark)
    run_until_caught_up(app, processors=["local"])
    minutes = {n: dict(app.db.query(app.db.sql(
        f"SELECT key, value FROM {app.db.table('aggregates')} WHERE aggregation = ?"),
        (f"{n}-minutes",))) for n in aggs}  # fmt: skip
    assert len(minutes["local"]) >= 4 and minutes["sparked"] == minutes["local"]
    closes: dict[str, list] = {n: [] for n in aggs}
    for e in app.store.iter_events(after=head):
        if e.type == "MinuteClosed":
            closes[e.data["of"]].append((e.stream_id.split(":", 1)[1], e.data["start"],
                                         e.data["ok"]))  # fmt: skip
    assert len(closes["local"]) > 10
    assert sorted(closes["sparked"]) == sorted(closes["local"])


def test_calendar_days_across_a_clock_change_on_spark_equal_the_local_engine(
    spark, tmp_path
) -> None:
    """Days of Europe/Paris over five days around the spring change (a 23-hour day), inputs
    up to 3 hours out of order (some late by the store's clock): Spark's windows, closes and
    late inputs equal the local engine's, and the counts equal the plain loop's
    (:mod:`eventlanes.windows.reference`)."""
    from eventlanes.windows.reference import count_windows

    app = el.App(f"sqlite:///{tmp_path}/e.db")
    window = el.calendar("day", tz="Europe/Paris")
    case = {"window": window, "lateness": "1h", "retain": "40000d"}
    local, sparked = (define(app, n, case, segments=2) for n in ("local", "sparked"))
    rng = random.Random(41)
    base = 1_774_569_600_000  # 2026-03-27T00:00:00Z, in ms
    events = [E("ScrewAttempted", {"robot": f"r{rng.randrange(3)}", "ok": rng.random() < 0.8,
                                   "ts": base + i * 600_000 - rng.randrange(3 * 3_600_000)})
              for i in range(700)]  # fmt: skip
    append(app.store, events)
    el.spark.replay(app, "sparked", spark=spark)
    run_until_caught_up(app)
    keys = ["r0", "r1", "r2"]
    want = results(app, local, keys)
    assert results(app, sparked, keys) == want
    lengths = {w[1] - w[0] for ws in want[0].values() for w in ws}
    assert 23 * 3_600_000_000 in lengths and 24 * 3_600_000_000 in lengths
    inputs = [(e.position, e.data["robot"], e.data["ts"] * 1000, recorded(e))
              for e in app.store.iter_events()]  # fmt: skip
    ref = count_windows(inputs, window, 3_600_000_000, 3_600_000_000)
    counted = {(k, w[0], w[1]): w[2]["ok"] + w[2]["failed"] for k, ws in want[0].items()
               for w in ws}  # fmt: skip
    assert counted == ref.counts and len(ref.late) == want[2]["late"] > 0


def test_what_spark_does_not_fold_yet_is_refused_before_any_work(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    opts = dict(key="robot", time=el.event_time("ts", unit="ms"), initial=dict)
    app.aggregation("sessions", window=el.session(gap="1m"), **opts)
    for name, why in [("sessions", "give a merge function")]:
        with pytest.raises(el.InvalidInputError, match=why):
            el.spark.replay(app, name, spark=spark)
    assert not (tmp_path / "e.db").exists()  # refused before the store was opened to claim


def published(bootstrap: str, topic: str) -> list[tuple]:
    """Every record of a topic of windows: (key, start, revision, value, its chain's root),
    sorted."""
    import json

    from tests.kafka_helpers import read_all

    found = []
    for m in (m for recs in read_all(bootstrap, topic, 2).values() for m in recs):
        v, root = json.loads(m.value()), json.loads(dict(m.headers())["el-source-chain"])[0]
        assert m.key().decode() == v["key"] and v["final"]
        found.append((v["key"], v["start_us"], v["revision"], json.dumps(v["value"]), root))
    return sorted(found, key=lambda r: (*r[:3], r[4]["offset"], r[4]["out"]))


@pytest.mark.parametrize(("window", "late"), [("1m", "park"), ("1m", "amend"), ("40s", "session")])
def test_a_replay_publishes_each_closed_window_as_the_local_engine(
    spark, kafka_broker, tmp_path, window: str, late: str
) -> None:
    """``publish=``: a Spark replay publishes each window that closed (those closed longer
    than ``retain``, which it does not write, too) before it commits, with the root the local
    engine gives it: kept late inputs publish what a local run publishes, record for record;
    sessions too (where each closed, found after the fold). Amended windows publish their
    latest revision, as one write of the local engine does: the latest revision of each
    window is the local engine's. Before, a replay refused ``publish=``."""
    from tests.kafka_helpers import create_topic

    b = kafka_broker.bootstrap
    path = tmp_path / "local.db"
    store = el.open_store(f"sqlite:///{path}")
    events = attempts(600, seed=21, clamp=590)
    append(store, events + events[::11])
    store.close()
    shutil.copy(path, tmp_path / "spark.db")
    records = {}
    for engine in ("local", "spark"):
        topic = create_topic(b, 2)
        case = {"window": el.tumbling(window), "late": late, "retain": "1m",
                "publish": el.KafkaSink(el.Kafka(b), topic)}  # fmt: skip
        if late == "session":
            case.update(window=el.session(gap=window), late="park")
        app = el.App(f"sqlite:///{tmp_path}/{engine}.db")
        define(app, "screws", case, segments=3)
        if engine == "local":
            run_until_caught_up(app)
        else:
            el.spark.replay(app, "screws", spark=spark)
        records[engine] = published(b, topic)
        app.close()
    closed = {(k, start) for k, start, *_ in records["local"]}
    assert len(closed) > 10
    if late != "amend":
        assert records["spark"] == records["local"]
        return
    latest = {}
    for k, start, revision, value, _ in records["local"]:
        latest[(k, start)] = (revision, value)
    assert max(r for r, _ in latest.values()) > 0  # some windows amended
    assert {(k, start): (r, v) for k, start, r, v, _ in records["spark"]} == latest
    assert len(records["spark"]) == len(closed)


def test_a_replay_on_spark_connect_equals_the_local_engine(spark_connect, tmp_path) -> None:
    """`eventlanes replay --remote`: the app's module (which the server's executors cannot
    import) shipped, its windows written as the local engine writes them on a copy of the
    store; sessions too (their closes found by Spark's window functions on Connect)."""
    from tests.apps.sessions_app import define as sessions
    from tests.apps.windows_app import define as screws
    from tests.test_spark_connect import cli

    url = f"sqlite:///{tmp_path}/events.db"
    app = el.App(url)
    events = attempts(500, seed=3, clamp=480)
    append(app.store, events + events[::13])
    app.close()
    shutil.copy(tmp_path / "events.db", tmp_path / "local.db")
    result = cli(spark_connect, "replay", "tests.apps.windows_app:app", "screws", "--remote",
                 spark_connect.url, url=url)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "screws: Spark read and replayed" in result.stdout
    local = el.App(f"sqlite:///{tmp_path}/local.db")
    screws(local, "screws", 3)
    run_until_caught_up(local)
    replayed = el.App(url)
    agg = screws(replayed, "screws", 3)
    keys = [f"r{i}" for i in range(5)]
    want = results(local, local.get("screws"), keys)
    assert want[2]["late"] > 0 and want[2]["duplicate"] == len(events[::13])
    assert results(replayed, agg, keys) == want
    result = cli(spark_connect, "replay", "tests.apps.sessions_app:app", "sessions", "--remote",
                 spark_connect.url, url=url)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    sessions(local, "sessions")
    run_until_caught_up(local)
    want = results(local, local.get("sessions"), keys)
    assert want[2]["late"] > 0 and any(w[3] for ws in want[0].values() for w in ws)
    assert results(replayed, sessions(replayed, "sessions"), keys) == want


def test_a_naive_event_time_fails_the_replay_naming_the_event(spark, tmp_path) -> None:
    """As the local engine stops on it: never guessed, nothing written, no token moved."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    agg = app.aggregation(
        "seen", key="robot", fields={"n": el.count()}, on="Seen", window=el.tumbling("1m"),
        time=el.event_time("at"),
    )  # fmt: skip
    app.store.append("a", [E("Seen", {"robot": "r", "at": "2026-11-29T10:00:01Z"})])
    (naive,) = app.store.append("a", [E("Seen", {"robot": "r", "at": "2026-11-29T10:00:02"})])
    with pytest.raises(el.EventlanesError, match=f"event {naive} \\(Seen\\).*no offset"):
        el.spark.replay(app, "seen", spark=spark)
    assert agg.windows("r") == [] and agg.window_counts()["folded"] == 0
    assert [s.position for s in app.status("seen").segments] == [0]


@pytest.mark.parametrize("partitions", [1, 4])
def test_the_partitions_spark_uses_change_nothing(spark, tmp_path, partitions: int) -> None:
    """The clock's ranges of positions and the fold's partitions follow Spark's partition
    count: any count gives the rows a local run gives; an empty store gives none, with every
    token at its end."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    case = CASES["hopping, store clock, amended, declared"]
    empty = define(app, "empty", case, segments=2)
    el.spark.replay(app, "empty", spark=spark, partitions=partitions)
    assert stored(app, "empty")[:2] == ((), ()) and empty.window_counts()["folded"] == 0
    local, sparked = (define(app, n, case, segments=2) for n in ("local", "sparked"))
    events = attempts(400, seed=11, clamp=399)
    append(app.store, events + events[::7])
    el.spark.replay(app, "sparked", spark=spark, partitions=partitions)
    run_until_caught_up(app)
    keys = [f"r{i}" for i in range(5)]
    assert results(app, sparked, keys) == results(app, local, keys)


def test_parts_come_over_without_holding_the_stores_write_lock(
    spark, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the fold's rows are staged in temporary tables while they come over, part by
    part: another connection (a heartbeat, a writer) can write between two parts; the short
    transaction that moves them in then gives the local engine's rows. A replay that fails
    its check after staging writes nothing."""
    import sqlite3

    import eventlanes.spark.staging
    import eventlanes.spark.windows as spark_windows

    monkeypatch.setattr(eventlanes.spark.staging, "PART", 40)
    path = tmp_path / "e.db"
    app = el.App(f"sqlite:///{path}")
    case = CASES["tumbling, store clock, kept, Python fold"]
    local, sparked = (define(app, n, case, segments=2) for n in ("local", "sparked"))
    events = attempts(400, seed=12, clamp=399)
    append(app.store, events + events[::7])
    parts_of, written = spark_windows.parts_of, []

    def watched(*args: object) -> object:
        for part in parts_of(*args):
            other = sqlite3.connect(path, timeout=0.2)
            try:
                other.execute("BEGIN IMMEDIATE")  # "database is locked" while a write is open
                other.execute("ROLLBACK")
                written.append(True)
            finally:
                other.close()
            yield part

    monkeypatch.setattr(spark_windows, "parts_of", watched)
    el.spark.replay(app, "sparked", spark=spark)
    assert len(written) > 3  # several parts, each with the lock free
    run_until_caught_up(app)
    keys = [f"r{i}" for i in range(5)]
    assert results(app, sparked, keys) == results(app, local, keys)
    el.spark.replay(app, "sparked", spark=spark)  # over rows of its own: they are replaced
    assert results(app, sparked, keys) == results(app, local, keys)
    before = stored(app, "sparked"), [s.position for s in app.status("sparked").segments]
    monkeypatch.setattr(spark_windows.Tally, "check", lambda *_: (_ for _ in ()).throw(
        el.SparkJobError("inputs do not add up")))  # fmt: skip
    with pytest.raises(el.SparkJobError, match="do not add up"):
        el.spark.replay(app, "sparked", spark=spark)
    assert (stored(app, "sparked"), [s.position for s in app.status("sparked").segments]) == before


def test_ticks_in_the_log_close_windows_on_spark_where_they_closed_locally(spark, tmp_path) -> None:
    """Idle time as events (``idle_close``): the ticks a local worker appended close the same
    windows at the same positions in a Spark replay of the same log."""
    from tests.processing_helpers import wait_for

    app = el.App(f"sqlite:///{tmp_path}/e.db")

    def counted(name: str, idle: str) -> el.Aggregation:
        return app.aggregation(name, key="robot", on="ScrewAttempted", fields={"n": el.count()},
                               window=el.tumbling("1s"), idle_close=idle)  # fmt: skip

    ticked, sparked = counted("ticked", "300ms"), counted("sparked", "1h")
    app.store.append("cell-1", [E("ScrewAttempted", {"robot": r}) for r in "aab"])
    app.start(["ticked"])
    try:

        def closed() -> bool:
            return all(ticked.windows(k) and all(w.final for w in ticked.windows(k)) for k in "ab")

        wait_for(closed, timeout=30, what="the windows closed by ticks")
    finally:
        app.stop()
    assert any(e.type == el.TICK for e in app.store.iter_events())
    el.spark.replay(app, "sparked", spark=spark)
    assert [sparked.windows(k) for k in "ab"] == [ticked.windows(k) for k in "ab"]
    assert stored(app, "sparked")[0] == stored(app, "ticked")[0]  # closed at the same ticks


def test_a_replay_from_an_export_equals_the_local_engine_and_another_stores_is_refused(
    spark, tmp_path
) -> None:
    """From a Parquet export (`--parquet`): the windows of its events; an export the store does
    not match (here: of another store) writes nothing and moves no token."""
    case = CASES["tumbling, store clock, kept, Python fold"]
    app = el.App(f"sqlite:///{tmp_path}/a.db")
    local, sparked = (define(app, n, case, segments=2) for n in ("local", "sparked"))
    events = attempts(300, seed=5, clamp=290)
    append(app.store, events + events[::9])
    export = str(tmp_path / "export")
    el.spark.export_parquet(app.store, export)
    el.spark.replay(app, "sparked", spark=spark, parquet=export)
    run_until_caught_up(app)
    keys = [f"r{i}" for i in range(5)]
    assert results(app, sparked, keys) == results(app, local, keys)
    other = el.App(f"sqlite:///{tmp_path}/o.db")
    agg = define(other, "sparked", case, segments=2)
    other.store.append("s", [E("ScrewAttempted", {"robot": "r0", "ok": True, "ts": 0})])
    with pytest.raises(el.InvalidInputError, match="does not match this store"):
        el.spark.replay(other, "sparked", spark=spark, parquet=export)
    assert agg.window_counts() == {"folded": 0, "late": 0, "clamped": 0, "duplicate": 0}
    assert all(s.position == 0 for s in other.status("sparked").segments)
