"""A record's ``el-source-chain`` header is an input, not a fact (issue 30, item 1): an ingestor
carries chains only from the upstream sources it is told to trust, every hop checked; a chain
that fails is a bad record (parked or stopping its partition), never a silent drop of genuine
inputs downstream and never an exception that ends the ingestor. A malformed chain already in
the store fails (or parks) the one event, named. Real broker, both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest

import eventlanes as el
from eventlanes.kafka import parking
from tests.kafka_helpers import create_topic, produce
from tests.processing_helpers import wait_for

E = el.NewEvent


def _chain(*hops: dict[str, Any]) -> list[tuple[str, bytes]]:
    return [("el-source-chain", json.dumps(list(hops)).encode())]


def _hop(source: str, offset: Any, out: Any = 0, partition: str = "0") -> dict[str, Any]:
    return {"source": source, "partition": partition, "offset": offset, "out": out}


def _app(store_url: str, bootstrap: str, topic: str, **options: Any) -> tuple[el.App, Any]:
    """An ingestor of ``topic`` (type "Screwed") and an aggregation summing ``n`` per robot."""
    app = el.App(store_url, claim_timeout=1.5)
    app.ingest("in", el.Kafka(bootstrap), topic=topic, type="Screwed", **options)
    sums = app.aggregation("sums", key="robot", initial=lambda: {"n": 0},
                           persist_every=0.05)  # fmt: skip

    @sums.on("Screwed")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    return app, sums


def _tokens(app: el.App) -> dict[int, int]:
    return {s.segment.id: s.position for s in app.tokens.status("in")}


def _run(app: el.App, tokens: dict[int, int]) -> None:
    app.start()
    try:
        wait_for(lambda: _tokens(app) == tokens, timeout=60, what=f"tokens {tokens}")
        app.wait_until_caught_up(60)
    finally:
        app.stop()


def _parked(app: el.App) -> list[tuple[int, str]]:
    return [(parking.ParkedRecord.of(d).offset, d.error) for d in app.dead_letter_list("in")]


def test_a_forged_root_on_the_ingested_topic_does_not_drop_genuine_records(
    store_url: str, kafka_broker
) -> None:
    """Attack 1: one record claims root offset 10**15 on the topic's own partition; before,
    the genuine records 2, 3, 4 of its key were dropped as duplicates, silently."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [("evil", {"robot": "r1", "n": 1}, _chain(_hop(topic, 10**15)))]
            + [("r1", {"robot": "r1", "n": n}, None) for n in (2, 3, 4)])  # fmt: skip
    app, sums = _app(store_url, b, topic, on_bad="dead_letter")
    _run(app, {0: 4})
    assert sums.get("r1") == {"n": 9}
    assert sums.dropped() == 0
    [(offset, error)] = _parked(app)
    assert offset == 0 and "el-source-chain" in error and "trust_chains" in error


def test_a_trusted_source_never_covers_the_ingested_topic_or_the_store(
    store_url: str, kafka_broker
) -> None:
    """``trust_chains`` naming the topic it reads is refused where written, naming the store's
    own events where it starts (the store is not opened before); a record whose root names
    either is bad even when other sources are trusted."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    app = el.App(store_url)
    own = app.store.events_table
    for names in ([topic], "up", [""], [5], ["up", "up:1"], [], True):
        with pytest.raises(el.InvalidInputError, match="trust_chains"):
            app.ingest("x", el.Kafka(b), topic=topic, type="T", trust_chains=names)
    app.ingest("x", el.Kafka(b), topic=topic, type="T", trust_chains=["up", own])
    with pytest.raises(el.InvalidInputError, match="trust_chains names this store's own"):
        app.start()
    app.stop()
    app.close()
    produce(b, topic, [("r1", {"robot": "r1", "n": 1}, _chain(_hop(topic, 10**15))),
                       ("r2", {"robot": "r2", "n": 1}, _chain(_hop(own, 10**15, partition=""))),
                       ("r3", {"robot": "r3", "n": 5}, _chain(_hop("up", 7)))])  # fmt: skip
    app, sums = _app(store_url, b, topic, on_bad="dead_letter", trust_chains=["up"])
    _run(app, {0: 3})
    parked = _parked(app)
    assert [o for o, _ in parked] == [0, 1]
    assert f"names the ingested topic {topic!r}" in parked[0][1]
    assert f"names this store's own events ({own!r})" in parked[1][1]
    assert sums.get("r3") == {"n": 5}  # a trusted chain is carried on
    [r3] = app.store.read_stream("r3")
    assert r3.metadata["source_chain"] == [_hop("up", 7), _hop(topic, 2)]


def test_a_forged_root_naming_the_store_does_not_blind_a_key(store_url: str, kafka_broker) -> None:
    """Attack 2: a record whose chain names the store's events table as root, at a huge
    offset; before, a plain ``store.append`` event of its key was then dropped, silently."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    app, sums = _app(store_url, b, topic, on_bad="dead_letter")
    own = app.store.events_table
    produce(b, topic, [("evil", {"robot": "r1", "n": 1},
                        _chain(_hop(own, 10**15, partition="")))])  # fmt: skip
    _run(app, {0: 1})
    app.store.append("r1", [E("Screwed", {"robot": "r1", "n": 2})])
    app.start()
    try:
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    assert sums.get("r1") == {"n": 2}
    assert sums.dropped() == 0
    [(offset, error)] = _parked(app)
    assert offset == 0 and "el-source-chain" in error


def test_a_trusted_topic_root_beyond_what_that_topic_reached_is_refused(
    store_url: str, kafka_broker
) -> None:
    """A root naming a trusted topic of the same cluster at an offset that topic's partition
    has not reached (or a partition it does not have): before, carried on, and the
    aggregation then dropped that source's genuine inputs as duplicates. A root within the
    topic, and one naming a source this cluster does not have, are carried on."""
    b = kafka_broker.bootstrap
    up, topic = create_topic(b, 2), create_topic(b, 1)
    produce(b, up, [("u", {"robot": "r0", "n": 0}, None)] * 3, partition=1)  # offsets 0-2
    roots = [
        _hop(up, 10**15, partition="1"),
        _hop(up, 3, partition="1"),
        _hop(up, 0, partition="2"),
        _hop(up, 2, partition="1"),
        _hop("elsewhere", 10**15),
        _hop(up, 10**15, partition=""),  # a store's root, not a partition: no topic to ask
    ]
    produce(b, topic, [(f"r{i}", {"robot": f"r{i}", "n": i}, _chain(root))
                       for i, root in enumerate(roots, 1)])  # fmt: skip
    app, sums = _app(store_url, b, topic, on_bad="dead_letter", trust_chains=[up, "elsewhere"])
    _run(app, {0: 6})
    parked = _parked(app)
    assert [o for o, _ in parked] == [0, 1, 2], parked
    assert "check_roots=False" in parked[0][1]  # what to do where the name is a mirror's
    assert f"offset 1,000,000,000,000,000 of {up}[1]" in parked[0][1]
    assert "high watermark is 3" in parked[0][1] and "high watermark is 3" in parked[1][1]
    assert f"partition '2' of topic {up!r}" in parked[2][1]
    assert sums.get("r4") == {"n": 4} and sums.get("r5") == {"n": 5} and sums.get("r6")
    assert sums.get("r1") is None and sums.dropped() == 0
    with pytest.raises(el.InvalidInputError, match="check_roots is True or False"):
        app.ingest("x", el.Kafka(b), topic=topic, type="T", trust_chains=[up], check_roots=1)


@pytest.mark.parametrize(("on_bad", "trust"), [("dead_letter", None), ("stop", ["up"])])
def test_a_deeply_nested_header_is_a_bad_record_not_the_end_of_the_ingestor(
    store_url: str, kafka_broker, on_bad: str, trust: Any
) -> None:
    """Attack 3: a header nested 100,000 deep; before, RecursionError escaped the bad-record
    check and ended the ingestor for every partition, again after each restart."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    deep = b"[" * 100_000 + b"]" * 100_000
    produce(b, topic, [("r1", {"robot": "r1", "n": 1}, [("el-source-chain", deep)]),
                       ("r2", {"robot": "r2", "n": 2}, None)], partition=0)  # fmt: skip
    produce(b, topic, [("r3", {"robot": "r3", "n": 3}, None)], partition=1)
    for _restart in range(2):  # the same record after a restart: still bad, nothing dies
        _ingest_past_the_deep_header(store_url, b, topic, on_bad, trust)


def _ingest_past_the_deep_header(
    store_url: str, b: str, topic: str, on_bad: str, trust: Any
) -> None:
    app, sums = _app(store_url, b, topic, on_bad=on_bad, trust_chains=trust)
    app.start()
    try:
        if on_bad == "stop":  # partition 0 stops at the record, partition 1 goes on
            wait_for(lambda: _tokens(app) == {0: 0, 1: 1}, timeout=60, what="tokens")
            wait_for(lambda: app.ingest_status("in").partitions[0].errors >= 1,
                     what="partition 0 stopped")  # fmt: skip
            error = app.ingest_status("in").partitions[0].last_error
            assert "record at offset 0 of partition 0 is bad" in error
            assert "el-source-chain" in error
        else:
            wait_for(lambda: _tokens(app) == {0: 2, 1: 1}, timeout=60, what="tokens")
        wait_for(lambda: sums.get("r3") is not None, timeout=60, what="r3 folded")
    finally:
        app.stop()
    assert sums.get("r3") == {"n": 3}
    if on_bad == "dead_letter":
        assert sums.get("r2") == {"n": 2}
        [(offset, error)] = _parked(app)
        assert offset == 0 and "el-source-chain" in error
    app.close()


def test_an_out_that_is_not_a_number_is_refused_at_ingest(store_url: str, kafka_broker) -> None:
    """Attack 4 at ingest: a hop with ``"out": "zz"`` was accepted; the aggregation's segment
    then failed on every retry and no key of it was folded again."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [("r1", {"robot": "r1", "n": 1}, _chain(_hop("up", 3, out="zz"))),
                       ("r2", {"robot": "r2", "n": 2}, None)])  # fmt: skip
    app, sums = _app(store_url, b, topic, on_bad="dead_letter")
    _run(app, {0: 2})
    assert sums.get("r2") == {"n": 2}
    [(offset, error)] = _parked(app)
    assert offset == 0 and "el-source-chain" in error


@pytest.mark.parametrize(
    ("hops", "why"),
    [
        ([_hop("up", 3, out="zz")], "'out' must be a whole number >= 0"),
        ([_hop("up", -1)], "'offset' must be a whole number >= 0"),
        ([_hop("up", True)], "'offset' must be a whole number >= 0"),
        ([_hop("up", 1.5)], "'offset' must be a whole number >= 0"),
        ([_hop("up", 2**70)], "'offset' must be a whole number >= 0"),
        ([{"source": "up", "partition": "0", "offset": 1}], "has keys"),
        ([{**_hop("up", 1), "more": 1}], "has keys"),
        ([_hop("", 1)], "'source' must be"),
        ([{**_hop("up", 1), "partition": 0}], "'partition' must be"),
        ([_hop("other", 1)], "root source 'other' is not one of trust_chains"),
        ([_hop("up", 1)] * 65, "more than 64 hops"),
        ([], "no hops"),
        ("[" * 30_000 + "]" * 30_000, "nested too deep"),
        ('{"a": 1', "is malformed"),
    ],
)
def test_every_hop_is_checked(hops: Any, why: str) -> None:
    """The checks of a trusted chain, hop by hop (no broker: the converter alone)."""
    from eventlanes.kafka.records import BadRecord, Converter, Record

    conv = Converter("t", None, "T", None, 1 << 20, trust=("up",), own_source="events")
    header = [("el-source-chain", hops.encode())] if isinstance(hops, str) else _chain(*hops)
    record = Record("t", 0, 9, b"k", b"{}", tuple(header), None)
    with pytest.raises(BadRecord, match="el-source-chain") as info:
        conv.event(record, "k")
    assert why in info.value.reason


def test_a_header_over_the_size_bound_is_refused_before_it_is_parsed() -> None:
    from eventlanes.kafka.records import BadRecord, Converter, Record

    conv = Converter("t", None, "T", None, 1 << 20, trust=("up",), own_source="events")
    big = json.dumps([_hop("up", 1, partition="x" * 70_000)]).encode()
    with pytest.raises(BadRecord, match="bytes"):
        conv.event(Record("t", 0, 9, b"k", b"{}", (("el-source-chain", big),), None), "k")


def test_a_malformed_chain_in_the_store_fails_the_segment_naming_the_event(
    store_url: str,
) -> None:
    """Attack 4 in the store (a chain written by an older release): the segment fails at the
    event, named in status (an aggregation retries, as for any fold that fails), and the
    error says what was wrong with the chain."""
    app = el.App(store_url)
    sums = app.aggregation("sums", key="k", initial=lambda: {"n": 0}, persist_every=0.05,
                           segments=1)  # fmt: skip

    @sums.on("Screwed")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]

    app.store.append("s1", [E("Screwed", {"k": "a", "n": 1},
                              {"source_chain": [_hop("up", 3, out="zz")]})])  # fmt: skip
    app.start()
    try:
        error = wait_for(
            lambda: next((s.last_error for s in app.status("sums").segments if s.last_error),
                         None), what="the segment's error")  # fmt: skip
    finally:
        app.stop()
    assert "event 1: malformed source_chain" in error and "hop 0: 'out' must be a whole" in error


def test_false_ignores_chains_and_a_name_covers_the_stages_of_its_aggregation() -> None:
    from eventlanes.kafka.records import Converter, Record

    header = tuple(_chain(_hop("robots:r1", 4, partition="")))
    record = Record("t", 0, 9, b"k", b"{}", header, None)
    ignored = Converter("t", None, "T", None, 1 << 20, trust=False, own_source="events")
    assert ignored.event(record, "k").metadata["source_chain"] == [_hop("t", 9)]
    carried = Converter("t", None, "T", None, 1 << 20, trust=("robots",), own_source="events")
    assert carried.event(record, "k").metadata["source_chain"] == [
        _hop("robots:r1", 4, partition=""), _hop("t", 9)
    ]  # fmt: skip
