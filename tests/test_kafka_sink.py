"""Publishing to Kafka (a real broker: the session's Tansu): events and aggregation states,
in order per key, with their source chain; the token only after the broker acknowledged;
duplicates a crash published dropped by an eventlanes ingest + aggregation downstream."""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from typing import Any

import pytest

import eventlanes as el
from tests.kafka_helpers import create_topic, read_all, run_until_ingested
from tests.processing_helpers import run_until_caught_up, wait_for


def _topic_records(b: str, topic: str, partitions: int) -> list[Any]:
    return [m for recs in read_all(b, topic, partitions).values() for m in recs]


def test_publisher_publishes_in_order_with_chains(store_url: str, kafka_broker) -> None:
    b = kafka_broker.bootstrap
    topic = create_topic(b, 3)
    app = el.App(store_url, claim_timeout=2)
    sink = el.KafkaSink(el.Kafka(b), topic)
    app.publisher("out", sink, on="Moved", segments=2)
    for i in range(300):
        app.store.append(f"robot-{i % 7}", [el.NewEvent("Moved", {"i": i})])
    app.store.append("robot-0", [el.NewEvent("Ignored", {})])
    app.start()
    try:
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    records = _topic_records(b, topic, 3)
    assert len(records) == 300
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for m in records:
        per_key[m.key()].append(json.loads(m.value())["i"])
        headers = dict(m.headers())
        assert headers["type"] == b"Moved"
        [hop] = json.loads(headers["el-source-chain"])
        assert hop["source"] == app.store.events_table and hop["partition"] == ""
    assert all(v == sorted(v) for v in per_key.values())
    assert sorted(i for v in per_key.values() for i in v) == list(range(300))


def test_token_waits_for_the_broker(tmp_path, kafka_broker) -> None:
    """While the broker is stopped nothing is acknowledged, so the token does not move; the
    batch is retried and the token moves once the broker is back."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    app = el.App(f"sqlite:///{tmp_path}/s.db", claim_timeout=2)
    sink = el.KafkaSink(el.Kafka(b), topic, ack_timeout=1.0)
    app.publisher("out", sink)
    app.store.append("a", [el.NewEvent("E", {"i": 0})])
    app.start()
    try:
        app.wait_until_caught_up(30)
        kafka_broker.pause()
        try:
            app.store.append("a", [el.NewEvent("E", {"i": 1})])
            wait_for(lambda: app.status("out").segments[0].errors >= 1, timeout=30,
                     what="a failed attempt")  # fmt: skip
            assert app.status("out").position == 1  # not past the unacknowledged event
        finally:
            kafka_broker.resume()
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    values = [json.loads(m.value())["i"] for m in _topic_records(b, topic, 1)]
    assert values[0] == 0 and values[-1] == 1 and set(values) == {0, 1}


def test_duplicates_from_a_crash_are_dropped_downstream(kafka_broker) -> None:
    """A publisher's batch fails after the broker acknowledged it (the crash window): it is
    published again on retry. Ingested on the other side and summed, every duplicate is
    dropped (counted), and the sums equal a plain fold."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    up = el.App(f"sqlite:///{tempfile.mkdtemp()}/up.db?prefix=up_", claim_timeout=2)
    sink = el.KafkaSink(el.Kafka(b), topic)
    proc = up.publisher("out", sink, segments=2, batch_size=50)
    failed: set[int] = set()

    @proc.on_batch()
    def crash_once(events: list[el.Event], ctx: el.Context) -> None:
        seg = ctx.segment.id
        if seg not in failed:
            failed.add(seg)
            raise RuntimeError("crashed after the broker acknowledged the batch")

    expected: dict[str, int] = defaultdict(int)
    for i in range(400):
        robot = f"robot-{i % 5}"
        up.store.append(robot, [el.NewEvent("Screwed", {"robot": robot, "n": i % 4})])
        expected[robot] += i % 4
    up.start()
    try:
        up.wait_until_caught_up(60)
    finally:
        up.stop()
    records = _topic_records(b, topic, 2)
    duplicates = len(records) - 400
    assert duplicates > 0  # the crash window was hit
    down = el.App(f"sqlite:///{tempfile.mkdtemp()}/down.db", claim_timeout=2)
    down.ingest("in", el.Kafka(b), topic=topic, trust_chains=["up_events"])
    sums = down.aggregation("sums", key="robot", initial=lambda: {"n": 0})

    @sums.on("Screwed")
    def add(state: dict[str, int], event: el.Event) -> None:
        state["n"] += event.data["n"]

    run_until_ingested(down, len(records))
    assert {r: sums.get(r)["n"] for r in expected} == dict(expected)
    assert sums.dropped() == duplicates


def test_aggregation_states_are_published(tmp_path, kafka_broker) -> None:
    """publish= on an aggregation and a downstream stage: each written state is published;
    the last record per key equals the state stored."""
    b = kafka_broker.bootstrap
    robots_topic, factories_topic = create_topic(b, 2), create_topic(b, 1)
    app = el.App(f"sqlite:///{tmp_path}/s.db", claim_timeout=2)
    kafka = el.Kafka(b)
    robots = app.aggregation(
        "robots", key=lambda e: str(e.data["robot"]), initial=lambda: {"ok": 0},
        publish=el.KafkaSink(kafka, robots_topic), persist_every=0.1,
    )  # fmt: skip
    factories = robots.downstream("factories", key=lambda out: out.data["factory"],
                                  initial=lambda: {"ok": 0},
                                  publish=el.KafkaSink(kafka, factories_topic))  # fmt: skip

    @robots.on("Screwed")
    def add(state: dict[str, int], event: el.Event) -> el.NewEvent:
        state["ok"] += event.data["ok"]
        return el.NewEvent("RobotOk", {"factory": f"f{event.data['robot'] % 2}",
                                       "ok": event.data["ok"]})  # fmt: skip

    @factories.on("RobotOk")
    def add_factory(state: dict[str, int], event: el.Event) -> None:
        state["ok"] += event.data["ok"]

    for i in range(200):
        app.store.append(f"cell-{i % 3}", [el.NewEvent("Screwed", {"robot": i % 4, "ok": i % 3})])
    app.start()
    try:
        app.wait_until_caught_up(60)
    finally:
        app.stop()

    def last_values(topic: str, partitions: int) -> dict[str, Any]:
        return {
            m.key().decode(): json.loads(m.value()) for m in _topic_records(b, topic, partitions)
        }

    assert last_values(robots_topic, 2) == {str(r): robots.get(str(r)) for r in range(4)}
    assert last_values(factories_topic, 1) == {f: factories.get(f) for f in ("f0", "f1")}
    try:
        el.KafkaSink(kafka, "bad topic")
    except el.InvalidInputError:
        pass
    else:
        raise AssertionError("a bad topic name must be refused")


def test_a_state_is_published_with_a_root_its_write_moved(tmp_path, kafka_broker) -> None:
    """A state fed by two sources (its store's own events and events re-appended from
    "up"): a write that moves only the second publishes the state with that one's
    coordinates, so a consumer that drops repeats by chain takes it. Before, the root was the
    first source's by name, which the write had not moved: the changed state went out as a
    repeat of the one before."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    app = el.App(f"sqlite:///{tmp_path}/s.db", claim_timeout=2)
    totals = app.aggregation("totals", key="k", initial=lambda: {"n": 0},
                             publish=el.KafkaSink(el.Kafka(b), topic))  # fmt: skip

    @totals.on("Counted")
    def add(state: dict[str, int], event: el.Event) -> None:
        state["n"] += 1

    def up(offset: int) -> el.NewEvent:
        chain = {"source_chain": [{"source": "up", "partition": "", "offset": offset}]}
        return el.NewEvent("Counted", {"k": "a"}, chain)

    app.store.append("s", [el.NewEvent("Counted", {"k": "a"}), up(5)])
    run_until_caught_up(app, 60)
    app.store.append("s", [up(6)])  # only "up" moves
    run_until_caught_up(app, 60)
    records = _topic_records(b, topic, 1)
    values = [json.loads(m.value()) for m in records]
    roots = [json.loads(dict(m.headers())["el-source-chain"])[0] for m in records]
    assert values == [{"n": 2}, {"n": 3}]
    assert [(r["source"], r["offset"]) for r in roots] == [(app.store.events_table, 1), ("up", 6)]


def test_versions_of_what_publishes_are_refused(tmp_path) -> None:
    """Before: ``app.publisher(..., version=2)`` was accepted and, starting from version 1's
    tokens, published all of history again (what version 1 had handled is a replay, which a
    publisher publishes); ``publish=`` on a version-2 aggregation published the states of its
    warm-up, then every state beside version 1's. Both refused where they are written."""
    app = el.App(f"sqlite:///{tmp_path}/v.db")
    sink = el.KafkaSink(el.Kafka("127.0.0.1:9"), "totals")  # never connects: refused first
    app.publisher("out", sink, on="Moved")
    with pytest.raises(el.InvalidInputError, match="a second version of a publisher would"):
        app.publisher("out", sink, on="Moved", version=2)
    app.aggregation("totals", key="k", initial=dict, publish=sink)
    with pytest.raises(el.InvalidInputError, match="publish= on version 2 would publish"):
        app.aggregation("totals", key="k", initial=dict, version=2, publish=sink)
    two = app.aggregation("counts", key="k", initial=dict, version=2)
    with pytest.raises(el.InvalidInputError, match="'per-day@v2': publish= on version 2"):
        two.downstream("per-day", key=lambda out: "d", initial=dict, publish=sink)
    assert sorted(app.processors) == ["counts@v2", "out", "totals"]
