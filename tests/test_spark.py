"""The Spark pipeline: bulk replay equal to the local engine, hand-off to the live processor."""

from __future__ import annotations

import json
import random
import shutil

import pytest

import eventlanes as el
from tests.processing_helpers import assert_exactly_once_in_order, run_until_caught_up, wait_for

E = el.NewEvent


def define(app: el.App, name: str, key: object = "robot") -> el.Aggregation:
    agg = app.aggregation(
        name, key=key, initial=lambda: {"ok": 0, "n": 0, "last": None},
        segments=4, batch_size=2000, persist_every=0.5,
    )  # fmt: skip

    @agg.on("ScrewsFastened")
    def add(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]
        state["n"] += 1
        state["last"] = event.version  # order-sensitive: the last one folded wins

    return agg


def load(store: el.EventStore, events: int, seed: int) -> None:
    """Skewed keys (a few robots get most events), duplicates through source chains."""
    rng = random.Random(seed)
    for i in range(events // 100):
        batch = []
        for _ in range(100):
            robot = f"r{int(rng.paretovariate(1.1)) % 5000}"
            meta = {}
            if rng.random() < 0.02:  # a re-appended output: same root as an earlier one
                meta = {"source_chain": [{"source": "up", "partition": "", "offset": i, "out": 0}]}
            batch.append(E("ScrewsFastened", {"robot": robot, "ok": rng.randrange(9)}, meta))
        store.append(f"cell-{i % 50}", batch)


def states(app: el.App, name: str) -> dict:
    t = app.db.table("aggregates")
    return dict(app.db.query(f"SELECT key, value FROM {t} WHERE aggregation = '{name}'"))


def test_replay_equals_the_local_engine_and_hands_off(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/spark.db", claim_timeout=5)
    local, replayed = define(app, "local"), define(app, "replayed")
    # A key function (Python on the executors) must give the same result as key="robot".
    by_function = define(app, "by-function", key=lambda e: e.data["robot"])
    load(app.store, 100_000, seed=1)
    app.start(["local"])
    try:
        app.wait_until_caught_up(120, ["local"])
    finally:
        app.stop()
    result = el.spark.replay(app, "replayed", spark=spark)
    assert result.end == app.store.head() == 100_000
    assert states(app, "replayed") == states(app, "local")
    el.spark.replay(app, "by-function", spark=spark)
    assert states(app, "by-function") == states(app, "local")
    del by_function
    assert replayed.dropped() == local.dropped() > 0
    drops = app.status("local").dropped_by
    assert app.status("replayed").dropped_by == app.status("by-function").dropped_by == drops
    assert drops == {"up": local.dropped()}
    assert all(s.position == result.end for s in app.status("replayed").segments)
    # The live processor continues from the replay's end: no gap, no double count.
    load(app.store, 3_000, seed=2)
    app.start(["local", "replayed"])
    try:
        app.wait_until_caught_up(60, ["local", "replayed"])
    finally:
        app.stop()
    assert states(app, "replayed") == states(app, "local")


def test_replay_refuses_while_running_and_reads_parquet(spark, store_url: str, tmp_path) -> None:
    app = el.App(store_url, claim_timeout=5)
    define(app, "screws")
    define(app, "check")  # never replayed: what the live engine alone computes
    load(app.store, 2_000, seed=3)
    app.start()
    try:
        from tests.processing_helpers import wait_for

        wait_for(lambda: all(s.owner for s in app.status("screws").segments), what="claims")
        with pytest.raises(el.ProcessorBusyError, match="is running"):
            el.spark.replay(app, "screws", spark=spark)
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    live = states(app, "screws")
    export = tmp_path / "export"
    end = el.spark.export_parquet(app.store, str(export))
    assert sorted(p.name for p in export.iterdir())[-1].endswith(".parquet")
    load(app.store, 500, seed=4)  # after the export: the live processor must fold these
    result = el.spark.replay(app, "screws", spark=spark, parquet=str(export))
    assert result.end == end == 2_000 < app.store.head()
    assert states(app, "screws") == live
    app.start()
    try:
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    assert states(app, "screws") == states(app, "check") != live


def test_replay_of_a_transactional_projection(spark, tmp_path) -> None:
    from tests.apps.recorder import clear, create_schema, record

    app = el.App(f"sqlite:///{tmp_path}/proj.db", claim_timeout=5)
    proc = app.processor("recorder", segments=4)
    proc.on_any(record)
    proc.on_reset(clear)
    table = create_schema(app)
    for i in range(3000):
        app.store.append(f"s-{i % 37}", [E("Step")])
    app.db.run_ddl([f"INSERT INTO {table} (stream_id, version, position) VALUES ('x', 1, 0)"])
    result = el.spark.replay(app, "recorder", spark=spark)
    assert result.events == 3000
    assert assert_exactly_once_in_order(app, table) == 3000  # the reset handler cleared 'x'
    assert all(s.position == 3000 for s in app.status("recorder").segments)
    # It had never run: nothing was handled before, so nothing is a replay.
    assert app.db.query(f"SELECT count(*) FROM {table} WHERE replay = 1")[0][0] == 0


def test_a_projection_replay_flags_only_what_was_handled_before(spark, tmp_path) -> None:
    """A Spark replay of a projection that had handled part of history (one half of its
    segments, merged since with the half that had handled nothing): the events it had handled
    are replays (the mails are not sent again), the others are handled as first-time (mailed,
    once). It used to flag every event a replay, so the never-handled ones were never mailed."""
    from tests.apps.recorder import create_schema, mail, record

    app = el.App(f"sqlite:///{tmp_path}/flags.db", claim_timeout=5)
    proc = app.processor("recorder", segments=2)
    proc.on_any(record)
    proc.on_any(mail)
    table = create_schema(app)
    app.db.run_ddl([f"CREATE TABLE {app.db.table('mails')} (position BIGINT)"])
    for i in range(400):
        app.store.append(f"s-{i % 37}", [E("Step")])
    app.start(node_index=0, nodes=2)  # only 0/1 runs
    try:
        wait_for(lambda: app.status("recorder").segments[0].caught_up, 60, what="segment 0/1")
    finally:
        app.stop()
    handled = {p for (p,) in app.db.query(f"SELECT position FROM {table}")}
    assert 0 < len(handled) < 400
    assert app.merge("recorder", 1) == "merged 1/1 and 0/1 into 0/0"
    el.spark.replay(app, "recorder", spark=spark)
    rows = app.db.query(f"SELECT position, replay FROM {table} ORDER BY id")[len(handled) :]
    assert sorted(rows) == [(p, int(p in handled)) for p in range(1, 401)]
    mails = [p for (p,) in app.db.query(f"SELECT position FROM {app.db.table('mails')}")]
    assert sorted(mails) == list(range(1, 401)), "each event mailed once, the first time"


def published_app(url: str, bootstrap: str, topics: dict[str, str]) -> el.App:
    """An aggregation and its downstream stage, each publishing its states (``publish=``)."""
    app = el.App(url, claim_timeout=5)
    kafka = el.Kafka(bootstrap)
    robots = app.aggregation("robots", key="robot", initial=lambda: {"ok": 0, "n": 0},
                             segments=2, publish=el.KafkaSink(kafka, topics["robots"]))  # fmt: skip
    factories = robots.downstream("factories", key=lambda out: out.data["factory"],
                                  initial=lambda: {"ok": 0},
                                  publish=el.KafkaSink(kafka, topics["factories"]))  # fmt: skip

    @robots.on("ScrewsFastened")
    def add(state: dict, event: el.Event) -> el.NewEvent:
        state["ok"] += event.data["ok"]
        state["n"] += 1
        return el.NewEvent("RobotOk", {"factory": f"f{len(event.data['robot']) % 3}",
                                       "ok": event.data["ok"]})  # fmt: skip

    @factories.on("RobotOk")
    def add_factory(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]

    return app


def newest_records(bootstrap: str, topic: str) -> dict[str, tuple]:
    """The last record of each key: its value, its chain's root and the newest root of any
    record of the key."""
    from tests.kafka_helpers import read_all

    found: dict[str, tuple] = {}
    for m in (m for recs in read_all(bootstrap, topic, 2).values() for m in recs):
        root = json.loads(dict(m.headers())["el-source-chain"])[0]
        newest = max(found.get(m.key().decode(), (0, 0, root))[2], root,
                     key=lambda r: (r["offset"], r["out"]))  # fmt: skip
        found[m.key().decode()] = (json.loads(m.value()), root, newest)
    return found


def test_a_replay_publishes_every_state_it_writes(spark, kafka_broker, tmp_path) -> None:
    """``publish=`` on an aggregation and on its downstream stage: a Spark replay publishes
    each state it writes before it commits, with the chain the local engine gives that state
    (a consumer drops the repeat of a state it had). Before, the replay wrote the states and
    moved every token past the events, and published nothing."""
    from tests.kafka_helpers import create_topic

    b = kafka_broker.bootstrap
    store = el.open_store(f"sqlite:///{tmp_path}/local.db")
    load(store, 3_000, seed=7)
    store.close()
    shutil.copy(tmp_path / "local.db", tmp_path / "spark.db")
    engines = {}
    for engine in ("local", "spark"):
        topics = {name: create_topic(b, 2) for name in ("robots", "factories")}
        app = published_app(f"sqlite:///{tmp_path}/{engine}.db", b, topics)
        assert app.store.head() == 3_000
        if engine == "local":
            run_until_caught_up(app, 120)
        else:
            el.spark.replay(app, "robots", spark=spark)
        engines[engine] = {name: newest_records(b, topic) for name, topic in topics.items()}
        stored = {name: {k: json.loads(v) for k, v in states(app, name).items()}
                  for name in topics}  # fmt: skip
        for name in topics:  # the newest record of each key is its stored state
            assert {k: v for k, (v, *_) in engines[engine][name].items()} == stored[name]
        assert len(stored["robots"]) > 50 and len(stored["factories"]) == 3
        app.close()
    # an aggregation's state: its chain's root is its offsets' (the local engine's last write's)
    same = [{k: r[:2] for k, r in engines[e]["robots"].items()} for e in ("spark", "local")]
    assert same[0] == same[1]
    # a stage's: the newest input folded into it (the local engine's last write holds it, or
    # an earlier one did, as segments wrote in turn)
    local, sparked = engines["local"]["factories"], engines["spark"]["factories"]
    assert {k: (v, newest) for k, (v, _, newest) in local.items()} == {
        k: (v, root) for k, (v, root, _) in sparked.items()
    }


def test_a_continuous_micro_batch_publishes_the_states_it_writes(
    spark, kafka_broker, tmp_path
) -> None:
    """``run --engine spark`` with ``publish=``: each micro-batch publishes the states it
    writes, an aggregation's and its stage's, before it commits. Before, it published
    nothing, and its tokens moved past the events."""
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all
    from tests.kafka_helpers import create_topic

    b = kafka_broker.bootstrap
    topics = {name: create_topic(b, 2) for name in ("robots", "factories")}
    app = published_app(f"sqlite:///{tmp_path}/cont.db", b, topics)
    load(app.store, 600, seed=5)
    runner = ContinuousAggregation(app, "robots", spark=spark, max_rows=400)
    app.initialize("robots")  # as start() does
    runner.records = claim_all(app.tokens, "robots", runner.owner)
    try:  # two micro-batches, by hand (start() would loop, racing the check)
        assert runner.run_batch() and runner.run_batch() and not runner.run_batch()
    finally:
        runner.stop()
    for name, topic in topics.items():
        stored = {k: json.loads(v) for k, v in states(app, name).items()}
        assert len(stored) >= 2
        assert {k: v for k, (v, *_) in newest_records(b, topic).items()} == stored


def test_a_micro_batch_roots_a_stages_state_in_an_input_it_folded(
    spark, kafka_broker, tmp_path
) -> None:
    """A stage's state fed by two upstream keys whose inputs came from a topic's two
    partitions (paths that cannot be compared): a micro-batch that moves only one of them
    publishes the state with that one's coordinates, so a consumer that drops repeats by
    chain takes it. Before, the root was the largest path of all, the other key's (from the
    first micro-batch), and the changed state went out as a repeat."""
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all
    from tests.kafka_helpers import create_topic, read_all

    b = kafka_broker.bootstrap
    topics = {name: create_topic(b, 1) for name in ("robots", "factories")}
    app = published_app(f"sqlite:///{tmp_path}/cont.db", b, topics)

    def screwed(robot: str, partition: int, offset: int) -> E:
        chain = {"source_chain": [{"source": "t", "partition": partition, "offset": offset}]}
        return E("ScrewsFastened", {"robot": robot, "ok": 1}, chain)

    # "ra" and "rb" feed one factory (f2); "ra"'s offset is far above "rb"'s
    app.store.append("cell", [screwed("ra", 0, 100_000), screwed("rb", 1, 10)])
    app.store.append("cell", [screwed("rb", 1, 11)])
    runner = ContinuousAggregation(app, "robots", spark=spark, max_rows=2)
    app.initialize("robots")
    runner.records = claim_all(app.tokens, "robots", runner.owner)
    try:
        assert runner.run_batch() and runner.run_batch() and not runner.run_batch()
    finally:
        runner.stop()
    records = [m for m in read_all(b, topics["factories"], 1)[0] if m.key() == b"f2"]
    values = [json.loads(m.value()) for m in records]
    roots = [json.loads(dict(m.headers())["el-source-chain"])[0] for m in records]
    assert values == [{"ok": 2}, {"ok": 3}]
    assert [(r["source"], r["offset"]) for r in roots] == [
        ("robots:ra", 100_000),
        ("robots:rb", 11),
    ]


def test_a_continuous_micro_batch_keeps_a_resets_replay_end(spark, tmp_path) -> None:
    """A micro-batch that ends below a reset's replay end moves each token on with it: the
    segments still say how far their replay goes (they were set to plain positions)."""
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all

    app = el.App(f"sqlite:///{tmp_path}/cont.db", claim_timeout=5)
    define(app, "screws")
    load(app.store, 400, seed=4)
    run_until_caught_up(app, 60, ["screws"])
    app.reset("screws", context="rebuild")
    runner = ContinuousAggregation(app, "screws", spark=spark, max_rows=100)
    # One micro-batch, by hand (start() would run them all in a loop, racing the check).
    runner.records = claim_all(app.tokens, "screws", runner.owner)
    try:
        assert runner.run_batch()
    finally:
        runner.stop()
    segments = app.status("screws").segments
    assert {s.position for s in segments} == {100}
    assert all(s.replaying and s.token.replay_until == 400 for s in segments)
    assert {s.token.replay_context for s in segments} == {"rebuild"}


def test_a_replayed_fold_returning_the_new_state_fails_and_writes_nothing(spark, tmp_path) -> None:
    """Before: Spark dropped what a fold returned where no stage takes outputs, as the local
    engine did: the replay wrote {"n": 0} for every key and moved the tokens past every event.
    Now it fails as the local engine does (the fold, the key, the event), writing nothing; an
    initial state no fold can change is refused before the job."""
    app = el.App(f"sqlite:///{tmp_path}/ret.db")
    returns = app.aggregation("returns", key="robot", initial=lambda: {"n": 0}, segments=2)
    returns.on("M")(lambda state, event: {"n": state["n"] + 1})
    zero = app.aggregation("zero", key="robot", initial=lambda: 0)
    zero.on("M")(lambda state, event: state + 1)
    app.store.append("s", [E("M", {"robot": f"r{i % 3}"}) for i in range(9)])
    with pytest.raises(el.SparkJobError, match=r"aggregation 'returns', key 'r\d': fold "
                       r"<lambda> returned dict \{'n': 1\} for event \d"):  # fmt: skip
        el.spark.replay(app, "returns", spark=spark)
    assert states(app, "returns") == {}
    assert all(s.position == 0 for s in app.status("returns").segments)
    with pytest.raises(el.InvalidInputError, match=r"initial\(\) gives int 0"):
        el.spark.replay(app, "zero", spark=spark)
    assert states(app, "zero") == {}
    assert all(s.position == 0 for s in app.status("zero").segments)


def test_outputs_of_two_folds_of_one_type_all_reach_the_stage_on_spark(spark, tmp_path) -> None:
    """Two folds of one type feeding a stage: each output numbered after the ones before it
    for the same input, as on the local engine (both first outputs were numbered 0, and the
    stage dropped the second as a repeat)."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    orders = app.aggregation("orders", key=lambda e: "all", initial=lambda: {"n": 0})
    both = orders.downstream("both", key=lambda e: "all", initial=lambda: {"n": 0})
    orders.on("Order")(lambda state, e: E("Count", {"n": e.data["wheels"]}))
    orders.on("Order")(lambda state, e: [E("Count", {"n": e.data["doors"]}), E("Count", {"n": 1})])

    @both.on("Count")
    def count(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    app.store.append("o1", [E("Order", {"wheels": 4, "doors": 2})] * 2)
    el.spark.replay(app, "orders", spark=spark)
    assert both.get("all") == {"n": 14} and both.dropped() == 0
    app.close()
