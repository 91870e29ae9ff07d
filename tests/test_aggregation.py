"""Exactly-once aggregations: dedupe on source coordinates, republishers, flat maps, stages."""

from __future__ import annotations

import json
import math
import random
import threading
import time

import pytest

import eventlanes as el
from tests.processing_helpers import kill_again_and_again, wait_for

E = el.NewEvent


def screws_app(url: str) -> tuple[el.App, el.Aggregation]:
    app = el.App(url, claim_timeout=2)
    screws = app.aggregation(
        "screws", key=lambda e: e.data["robot"], initial=lambda: {"ok": 0, "failed": 0},
        persist_every=0.05, segments=2,
    )  # fmt: skip

    @screws.on("ScrewsFastened")
    def add(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]
        state["failed"] += event.data["failed"]

    return app, screws


def chain(offset: int, partition: object = "", source: str = "robots", out: int = 0) -> dict:
    return {"source_chain": [{"source": source, "partition": partition, "offset": offset,
                              "out": out}]}  # fmt: skip


def run_until_caught_up(app: el.App) -> None:
    app.start()
    try:
        app.wait_until_caught_up(30)
    finally:
        app.stop()


def test_sums_are_exact_and_persisted(store_url: str) -> None:
    app, screws = screws_app(store_url)
    rng = random.Random(1)
    want: dict[str, dict[str, int]] = {}
    for i in range(300):
        robot, ok, failed = f"r{rng.randrange(7)}", rng.randrange(10), rng.randrange(3)
        app.store.append(f"cell-{i % 5}", [E("ScrewsFastened", {"robot": robot, "ok": ok,
                                                                 "failed": failed})])  # fmt: skip
        w = want.setdefault(robot, {"ok": 0, "failed": 0})
        w["ok"] += ok
        w["failed"] += failed
    run_until_caught_up(app)
    assert {r: screws.get(r) for r in want} == want
    assert screws.get("nobody") is None
    # A restart folds nothing twice.
    run_until_caught_up(app)
    assert {r: screws.get(r) for r in want} == want
    assert screws.dropped() == 0


def test_duplicate_deliveries_are_dropped_and_counted(store_url: str) -> None:
    app, screws = screws_app(store_url)
    for offset in (1, 2, 3):
        app.store.append("derived", [E("ScrewsFastened", {"robot": "r1", "ok": 1, "failed": 0},
                                       chain(offset))])  # fmt: skip
    # A republisher that crashed before committing its token appends 2 and 3 again, and 1 later.
    for offset in (2, 3, 1):
        app.store.append("derived", [E("ScrewsFastened", {"robot": "r1", "ok": 1, "failed": 0},
                                       chain(offset))])  # fmt: skip
    app.store.append("derived", [E("ScrewsFastened", {"robot": "r1", "ok": 1, "failed": 0},
                                   chain(4))])  # fmt: skip
    run_until_caught_up(app)
    assert screws.get("r1") == {"ok": 4, "failed": 0}
    assert screws.dropped() == 3


def test_a_repartitioned_source_starts_tracking_over(store_url: str) -> None:
    app, screws = screws_app(store_url)

    def add(offset: int, partition: int) -> None:
        data = {"robot": "r1", "ok": 1, "failed": 0}
        app.store.append(
            "kafka-import", [E("ScrewsFastened", data, chain(offset, partition, "kafka"))]
        )

    add(10, 0)
    add(11, 0)
    add(11, 0)  # duplicate: dropped
    add(1, 1)  # the topic was repartitioned: partition 1 starts over at offset 1
    add(2, 1)
    add(2, 1)  # duplicate in the new partition: dropped
    run_until_caught_up(app)
    assert screws.get("r1") == {"ok": 4, "failed": 0}
    assert screws.dropped() == 2
    [row] = app.db.query(f"SELECT offsets FROM {app.db.table('aggregates')} WHERE key = 'r1'")
    assert json.loads(row[0])["kafka"] == ["1", [2, 0]]


def test_republisher_flat_map_and_downstream_stage(store_url: str) -> None:
    from examples.screws import append_raw, build

    app = el.App(store_url, claim_timeout=2)
    _, screws, factories = build(app)
    reference = append_raw(app.store, 120, seed=3)
    run_until_caught_up(app)
    assert {r: screws.get(str(r)) for r in reference["robots"]} == reference["robots"]
    assert {f: factories.get(f) for f in reference["factories"]} == reference["factories"]
    derived = [e for e in app.store.iter_events() if e.type == "ScrewsFastened"]
    assert len(derived) == reference["outputs"]
    first = derived[0].metadata["source_chain"]
    assert first[0]["source"] == app.store.events_table and first[0]["out"] == 0


def test_outputs_of_two_functions_of_one_type_are_all_folded(store_url: str) -> None:
    """Two mappings of one type (a republisher), two folds of one type feeding a stage: each
    output is numbered after the ones before it for the same input. Both functions' first
    outputs were numbered 0, so the second came with the first's coordinates and was
    dropped downstream as a repeat (4 parts counted of 6)."""
    app = el.App(store_url)
    rep = app.republisher("split", to_stream="parts")
    rep.on("Order")(lambda e: el.NewEvent("Part", {"shop": "s", "n": e.data["wheels"]}))
    rep.on("Order")(lambda e: [el.NewEvent("Part", {"shop": "s", "n": e.data["doors"]}),
                               el.NewEvent("Part", {"shop": "s", "n": 1})])  # fmt: skip
    parts = app.aggregation("parts", key="shop", initial=lambda: {"n": 0})

    @parts.on("Part")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    orders = app.aggregation("orders", key=lambda e: "all", initial=lambda: {"n": 0})
    both = orders.downstream("both", key=lambda e: "all", initial=lambda: {"n": 0})

    @orders.on("Order")
    def wheels(state: dict, event: el.Event) -> el.NewEvent:
        state["n"] += 1
        return el.NewEvent("Count", {"n": event.data["wheels"]})

    @orders.on("Order")
    def doors(state: dict, event: el.Event) -> el.NewEvent:
        return el.NewEvent("Count", {"n": event.data["doors"]})

    @both.on("Count")
    def count(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    app.store.append("o1", [el.NewEvent("Order", {"wheels": 4, "doors": 2})])
    run_until_caught_up(app)
    assert parts.get("s") == {"n": 7} and parts.dropped() == 0
    assert both.get("all") == {"n": 6} and both.dropped() == 0
    outs = [e.metadata["source_chain"][0]["out"] for e in app.store.iter_events()
            if e.type == "Part"]  # fmt: skip
    assert outs == [0, 1, 2]


def test_bad_aggregation_definitions(store_url: str) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match="key must be a function"):
        app.aggregation("a", key=42, initial=dict)
    with pytest.raises(el.InvalidInputError, match="initial must be a function"):
        app.aggregation("a", key=lambda e: 1, initial={})
    with pytest.raises(el.InvalidInputError, match="persist_every"):
        app.aggregation("a", key=lambda e: 1, initial=dict, persist_every=-1)
    with pytest.raises(el.InvalidInputError, match="to_stream"):
        app.republisher("r", to_stream="")


def test_chaos_sigkill_republisher_and_aggregator_exact_totals(store_url: str, tmp_path) -> None:
    """Workers running the republisher and the aggregation are SIGKILLed again and again (the
    republisher pauses after appending, so kills land between its append and its token); the
    totals end exactly equal to the reference."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from examples.screws import append_raw, build

    root = Path(__file__).resolve().parent.parent
    app = el.App(store_url, claim_timeout=1.5)
    _, screws, factories = build(app)
    env = {**os.environ, "EVENTLANES_DEMO_URL": store_url, "EVENTLANES_DEMO_PAUSE": "0.02"}

    log = tmp_path / "workers.log"

    def worker() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "eventlanes.cli", "run", "examples.screws:app",
             "--no-progress"], cwd=root, env=env, stdout=subprocess.DEVNULL,
            stderr=log.open("a"),  # shown if the test fails: which worker said what
        )  # fmt: skip

    reference: dict = {}
    loader = threading.Thread(target=lambda: reference.update(append_raw(app.store, 1500, 9)))
    loader.start()
    workers = [worker(), worker()]
    try:
        kill_again_and_again(workers, worker, loader.is_alive, 8, pause=(0.3, 0.9), seed=5)
        loader.join()
        try:
            wait_for(lambda: app.status("normalise").caught_up, timeout=120, what="republisher")
            app.wait_until_caught_up(120)
        except (AssertionError, TimeoutError):
            codes = [p.poll() for p in workers]
            lines = log.read_text().splitlines()
            print(f"workers' exit codes: {codes}\n" + "\n".join(lines[-80:]))
            raise
    finally:
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.wait(60)
    assert {r: screws.get(str(r)) for r in reference["robots"]} == reference["robots"]
    assert {f: factories.get(f) for f in reference["factories"]} == reference["factories"]
    derived = sum(1 for e in app.store.iter_events() if e.type == "ScrewsFastened")
    # Re-appended outputs (if a kill hit the window) exist in the store and were dropped.
    print(f"re-appended and dropped: {screws.dropped()}")
    assert derived - reference["outputs"] == screws.dropped()


def test_two_writers_of_a_new_downstream_key_lose_no_update(store_url: str) -> None:
    """Two upstream segments (in two processes) feed one downstream key that has no row yet:
    a row that does not exist cannot be locked, so the second writer used to start from the
    initial state too and overwrite the first (found by the chaos test on PostgreSQL)."""

    app = el.App(store_url)
    table = app.aggregate_states
    db = app.db
    first_holds_it = threading.Event()

    def add_one(hold: bool) -> None:
        with db.transaction() as conn:
            entries = table.lock(conn, "stage", ["factory-1"], lambda: {"ok": 0})
            entries["factory-1"].value["ok"] += 1
            if hold:
                first_holds_it.set()
                time.sleep(0.5)  # the other writer tries meanwhile
            table.save(conn, "stage", entries)

    first = threading.Thread(target=add_one, args=(True,))
    first.start()
    assert first_holds_it.wait(10)
    add_one(False)
    first.join()
    assert table.get("stage", "factory-1") == {"ok": 2}
    app.close()


def test_non_finite_floats_in_a_state_are_kept(store_url: str) -> None:
    """A state holding NaN or an infinity is stored and read back as such, never as null."""
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

    def define(app: el.App) -> el.Aggregation:
        agg = app.aggregation("extremes", key="k", initial=lambda: {"x": None, "n": 0})

        @agg.on("M")
        def fold(state: dict, event: el.Event) -> None:
            state["x"] = special.get(event.data["v"], event.data["v"])
            state["n"] += 1

        return agg

    app = el.App(store_url)
    agg = define(app)
    app.store.append("s", [E("M", {"k": k, "v": k}) for k in ("nan", "inf", "-inf")])
    app.store.append("s", [E("M", {"k": "plain", "v": 1.5})])
    run_until_caught_up(app)
    for view in (agg, define(el.App(store_url))):  # the second decodes the stored text afresh
        assert math.isnan(view.get("nan")["x"])
        assert view.get("inf") == {"x": math.inf, "n": 1}
        assert view.get("-inf") == {"x": -math.inf, "n": 1}
        assert view.get("plain") == {"x": 1.5, "n": 1}


def _segment_error(app: el.App, name: str) -> str:
    """The first error shown in the processor's status (waits for one)."""

    def error() -> str | None:
        return next((s.last_error for s in app.status(name).segments if s.last_error), None)

    return wait_for(error, timeout=30, what=f"an error in the status of {name}")


def test_a_state_that_would_not_read_back_equal_is_refused_naming_aggregation_and_key(
    store_url: str,
) -> None:
    """A state with an integer key beside the same key as text: JSON would have kept one of the
    two values, silently (and the cached state would differ from the stored one)."""
    app = el.App(store_url)
    counts = app.aggregation("counts", key="robot", initial=lambda: {"1": "text key"},
                             persist_every=0.05)  # fmt: skip

    @counts.on("M")
    def fold(state: dict, event: el.Event) -> None:
        state[event.data["n"]] = "int key"

    app.store.append("s", [E("M", {"robot": "r1", "n": 1})])
    app.start()
    try:
        error = _segment_error(app, "counts")
    finally:
        app.stop()
    assert "aggregation 'counts', key 'r1': state: key 1 is not a string" in error
    assert "also a key there" in error
    assert counts.get("r1") is None  # nothing written, the token did not move
    assert app.status("counts").position == 0


def test_a_tuple_in_a_state_is_refused_with_its_path(store_url: str) -> None:
    app = el.App(store_url)
    spots = app.aggregation("spots", key="robot", initial=lambda: {"at": []}, persist_every=0.05)

    @spots.on("M")
    def fold(state: dict, event: el.Event) -> None:
        state["at"].append((event.data["x"], event.data["y"]))

    app.store.append("s", [E("M", {"robot": "r1", "x": 1, "y": 2})])
    app.start()
    try:
        error = _segment_error(app, "spots")
    finally:
        app.stop()
    assert "aggregation 'spots', key 'r1': state[\"at\"][0]: a tuple would read back" in error
    assert spots.get("r1") is None


def test_states_are_written_in_chunks_and_every_one_arrives(store_url: str) -> None:
    """One write of more states than a chunk: all of them, exact, in one transaction."""
    from eventlanes.processing.tables.states import CHUNK

    keys = 2 * CHUNK + 37
    app = el.App(store_url)
    agg = app.aggregation("many", key="k", initial=lambda: {"n": 0}, persist_every=0.05,
                          batch_size=keys + 1, segments=1)  # fmt: skip

    @agg.on("M")
    def fold(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    app.store.append("s", [E("M", {"k": f"k{i}", "n": i}) for i in range(keys)])
    run_until_caught_up(app)
    table = app.db.table("aggregates")
    rows = app.db.query(app.db.sql(f"SELECT key, value FROM {table} WHERE aggregation = ?"),
                        ("many",))  # fmt: skip
    assert {k: json.loads(v) for k, v in rows} == {f"k{i}": {"n": i} for i in range(keys)}


def test_fold_outputs_that_would_not_read_back_equal_are_refused(store_url: str) -> None:
    """The Spark engine passes fold outputs on as JSON, the local one in memory: an output that
    JSON would change is refused on both, so they never fold different values."""
    app = el.App(store_url)
    up = app.aggregation("up", key="robot", initial=lambda: {"n": 0}, persist_every=0.05)
    down = up.downstream("down", key=lambda out: out.data["factory"], initial=lambda: {"n": 0})

    @up.on("M")
    def fold(state: dict, event: el.Event) -> el.NewEvent:
        state["n"] += 1
        return E("Counted", {"factory": "f1", "by_shift": {event.data["shift"]: 1}})

    @down.on("Counted")
    def count(state: dict, event: el.Event) -> None:
        state["n"] += 1

    app.store.append("s", [E("M", {"robot": "r1", "shift": 2})])
    app.start()
    try:
        error = _segment_error(app, "up")
    finally:
        app.stop()
    assert (
        "aggregation 'up', key 'r1': output #0 of event 1 (Counted) data[\"by_shift\"]: "
        "key 2 is not a string" in error
    )
    assert up.get("r1") is None and down.get("f1") is None


def test_republisher_outputs_that_would_not_read_back_equal_are_refused(store_url: str) -> None:
    app = el.App(store_url)
    rep = app.republisher("normalise", to_stream="out")

    @rep.on("Raw")
    def split(event: el.Event) -> list[el.NewEvent]:
        return [E("Ok", {"n": 1}), E("Bad", {"pair": (1, 2)})]

    app.store.append("s", [E("Raw")])
    app.start()
    try:
        error = _segment_error(app, "normalise")
    finally:
        app.stop()
    assert "republisher 'normalise': output #1 of event 1 (Bad) data[\"pair\"]: a tuple" in error
    assert app.store.stream_version("out") == 0  # nothing appended, not even the good output


def test_a_fold_returning_the_new_state_is_refused_not_dropped(store_url: str) -> None:
    """Before: ``return {"n": state["n"] + 1}`` was taken for outputs no stage wanted and
    dropped: the state stayed {"n": 0}, written with a token past every event. Now the
    segment fails naming the fold and the event, and nothing is written."""
    app = el.App(store_url)
    counts = app.aggregation("counts", key="robot", initial=lambda: {"n": 0}, persist_every=0.05)

    @counts.on("M")
    def add(state: dict, event: el.Event) -> dict:
        return {"n": state["n"] + 1}

    app.store.append("s", [E("M", {"robot": "r1"}), E("M", {"robot": "r1"})])
    app.start()
    try:
        error = _segment_error(app, "counts")
    finally:
        app.stop()
    assert "aggregation 'counts', key 'r1': fold add returned dict {'n': 1} for event 1" in error
    assert "no downstream stage takes a fold's outputs" in error
    assert counts.get("r1") is None
    assert app.status("counts").position == 0


def test_a_fold_returning_its_state_updated_in_place_counts(store_url: str) -> None:
    app = el.App(store_url)
    counts = app.aggregation("counts", key="robot", initial=lambda: {"n": 0}, persist_every=0.05)

    @counts.on("M")
    def add(state: dict, event: el.Event) -> dict:
        state["n"] += 1
        return state  # the state itself: allowed

    app.store.append("s", [E("M", {"robot": "r1"}), E("M", {"robot": "r1"})])
    run_until_caught_up(app)
    assert counts.get("r1") == {"n": 2}


def test_an_initial_state_no_fold_can_change_is_refused(tmp_path) -> None:
    """Before: ``initial=lambda: 0`` with ``state += 1`` (or ``return state + 1``) ran, and
    every state stayed 0. An int, a string, a tuple or None cannot be updated in place:
    refused when the app starts (downstream stages may still be declared until then), and at
    once for a downstream stage (it has no stages of its own)."""
    app = el.App(f"sqlite:///{tmp_path}/i.db")
    counts = app.aggregation("counts", key="robot", initial=lambda: 0)

    @counts.on("M")
    def add(state: int, event: el.Event) -> None:
        state += 1  # noqa: F841 - rebinds the local name only: the user's mistake

    app.store.append("s", [E("M", {"robot": "r1"})])
    with pytest.raises(el.InvalidInputError, match=r"aggregation 'counts': initial\(\) gives "
                       r"int 0, which no fold can change"):  # fmt: skip
        app.start()
    assert not app.running
    assert counts.get("r1") is None

    splitter = app.aggregation("split", key="robot", initial=lambda: None)
    with pytest.raises(el.InvalidInputError, match=r"stage 'down': initial\(\) gives tuple"):
        splitter.downstream("down", key=lambda out: "k", initial=tuple)
    app.close()

    # An upstream state that never changes is fine when its folds only feed a stage.
    app = el.App(f"sqlite:///{tmp_path}/i.db")
    splitter = app.aggregation("split", key="robot", initial=lambda: None, persist_every=0.05)
    down = splitter.downstream("per-factory", key=lambda out: "f", initial=lambda: {"n": 0})
    splitter.on("M")(lambda state, event: el.NewEvent("Counted"))

    @down.on("Counted")
    def count(state: dict, event: el.Event) -> None:
        state["n"] += 1

    run_until_caught_up(app)
    assert down.get("f") == {"n": 1}
    app.close()


def test_a_republisher_that_would_read_its_own_outputs_again_is_refused(store_url: str) -> None:
    """Before: a mapping of "Raw" returning a "Raw" into the store it reads (or an ``on_any``
    mapping there) republished its own outputs forever, the store growing without end. Now
    ``on_any`` there is refused where it is written, and an output of a type the republisher
    maps, appended to the store it reads, fails the segment before anything is appended."""
    app = el.App(store_url)
    rep = app.republisher("copy", to_stream="copies")

    @rep.on("Raw")
    def again(event: el.Event) -> el.NewEvent:
        return E("Raw", {"n": 1})

    # The app's own store given as to_store: the same store, found when it runs.
    mirror = app.republisher("mirror", to_stream="mirrored", to_store=app.store)
    mirror.on_any(lambda event: E("Mirrored"))
    app.store.append("s", [E("Raw")])
    app.start()
    try:
        errors = {name: _segment_error(app, name) for name in ("copy", "mirror")}
    finally:
        app.stop()
    assert "republisher 'copy': output #0 of event 1 is a 'Raw', a type it maps" in errors["copy"]
    assert "republisher 'mirror': output #0 of event 1 is a 'Mirrored'" in errors["mirror"]
    assert app.store.head() == 1  # nothing appended


def test_a_republisher_on_any_into_the_store_it_reads_is_refused_where_written(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/any.db")
    rep = app.republisher("copy", to_stream="copies")
    with pytest.raises(el.InvalidInputError, match="republisher 'copy': on_any maps every event"):
        rep.on_any(lambda event: E("Copy"))


def test_the_segments_held_are_written_together_and_one_that_cannot_be_stored_writes_alone(
    store_url: str,
) -> None:
    """A process writes the segments it holds together (their states and tokens in one
    transaction). One whose state cannot be stored fails alone: its error is shown, nothing
    of it is written, and the other segment's states and token are."""
    app = el.App(store_url)
    agg = app.aggregation("counts", key="k", initial=lambda: {"n": 0}, segments=2,
                          persist_every=0.5)  # fmt: skip
    keys = [next(k for k in (f"k{i}" for i in range(100)) if el.stable_hash(k) & 1 == seg)
            for seg in (0, 1)]  # fmt: skip

    @agg.on("In")
    def count(state: dict, event: el.Event) -> None:
        state["n"] += 1
        if event.data["k"] == keys[1]:
            state["seen"] = {1, 2}  # a set: JSON cannot hold it

    app.store.append("s", [el.NewEvent("In", {"k": k}) for k in keys])
    app.start()
    try:
        error = wait_for(lambda: app.status("counts").segments[1].last_error, timeout=15,
                         what="segment 1's error")  # fmt: skip
        wait_for(lambda: agg.get(keys[0]) == {"n": 1}, timeout=15, what="segment 0 written")
    finally:
        app.stop()
    assert f"key {keys[1]!r}: state" in error
    assert agg.get(keys[1]) is None
    assert [s.position for s in app.status("counts").segments] == [2, 0]
    app.close()


def test_a_republisher_into_another_store_with_the_same_table_names_is_refused(
    tmp_path,
) -> None:
    """Outputs carry a chain rooted in this store's events table; another store whose events
    table has the same name took those roots for its own events: an aggregation there dropped
    genuine inputs as repeats. Refused at start (as a Kafka ingest refuses it)."""
    a = el.App(f"sqlite:///{tmp_path}/a.db")
    b_url = f"sqlite:///{tmp_path}/b.db"
    el.open_store(b_url).close()
    a.republisher("copy", to_stream="parts", to_store=b_url).on("Order")(lambda e: e)
    with pytest.raises(
        el.InvalidInputError,
        match=r"'copy': to_store keeps its events in a table named 'el_events'",
    ):
        a.start(["copy"])
    assert not a.running
    ok = el.App(f"sqlite:///{tmp_path}/a.db")
    other = f"sqlite:///{tmp_path}/b.db?prefix=b_"
    ok.republisher("copy", to_stream="parts", to_store=other).on("Order")(
        lambda e: el.NewEvent("Part", e.data)
    )
    ok.store.append("o", [el.NewEvent("Order", {"n": 1})])
    ok.start(["copy"])
    try:
        ok.wait_until_caught_up(30, ["copy"])
    finally:
        ok.stop()
    assert [e.type for e in el.open_store(other).iter_events()] == ["Part"]
    a.close()
    ok.close()
