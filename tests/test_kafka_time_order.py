"""``order="time"``: an ingestor catching up on a backlog interleaves the partitions' records
by their timestamps (each partition still in offset order), so a windowed aggregation's store
clock does not run ahead with the first partition read and call the others late. The default
(``"arrival"``) appends a batch a partition after another; over the same backlog, the clock
calls many records late (kept and counted, never lost)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from tests.kafka_helpers import create_topic, run_until_ingested

BASE_MS = 1_767_225_600_000
PER_PARTITION, STEP_MS = 150, 10_000  # 25 minutes of each robot's time


def backlog(bootstrap: str, topic: str) -> Counter[tuple[str, int]]:
    """A partition after another, each the same 25 minutes in order; the record timestamps
    are the readings' times. The plain loop's count per (robot, minute start in µs)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    want: Counter[tuple[str, int]] = Counter()
    for p in range(4):
        for i in range(PER_PARTITION):
            ts = BASE_MS + i * STEP_MS
            value = json.dumps({"robot": f"r{p}", "ts": ts}).encode()
            producer.produce(topic, value, f"r{p}".encode(), partition=p, timestamp=ts)
            want[(f"r{p}", (ts - ts % 60_000) * 1000)] += 1
        producer.flush(30)
    return want


def ingest(path: Path, kafka: el.Kafka, topic: str, **order: Any) -> tuple[el.App, el.Aggregation]:
    app = el.App(f"sqlite:///{path}", claim_timeout=2)
    app.ingest("in", kafka, topic=topic, type="Reading", **order)
    agg = app.aggregation(
        "per-minute", key="robot", on="Reading", fields={"n": el.count()},
        window=el.tumbling("1m"), time=el.event_time("ts", unit="ms"), lateness="5s",
        retain="1d",
    )  # fmt: skip
    run_until_ingested(app, 4 * PER_PARTITION)
    return app, agg


def test_a_backlog_interleaved_by_time_leaves_no_reading_late(
    tmp_path: Path, kafka_broker: Any
) -> None:
    b = kafka_broker.bootstrap
    topic, kafka = create_topic(b, 4), el.Kafka(b)
    want = backlog(b, topic)
    app, agg = ingest(tmp_path / "time.db", kafka, topic, order="time")
    log = [(e.data["robot"], e.data["ts"]) for e in app.store.iter_events()]
    assert [ts for _, ts in log] == sorted(ts for _, ts in log)  # one timeline across them
    for robot in ("r0", "r1", "r2", "r3"):  # each partition in its own order, all of it
        assert [ts for r, ts in log if r == robot] == [
            BASE_MS + i * STEP_MS for i in range(PER_PARTITION)
        ]
    assert agg.window_counts()["late"] == 0
    got = {(r, w.start_us): w.value["n"] for r in ("r0", "r1", "r2", "r3") for w in agg.windows(r)}
    assert got == dict(want)

    arrival, plain = ingest(tmp_path / "arrival.db", kafka, topic)  # the default, as before
    counts = plain.window_counts()
    assert counts["late"] > 0 and counts["late"] + counts["folded"] == 4 * PER_PARTITION


def test_partitions_paused_while_their_buffers_are_full_lose_and_double_nothing(
    tmp_path: Path, kafka_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for 40 records per partition, each is paused and resumed again and again
    (the broker then hands out the others'): every record appended once, in time order."""
    from eventlanes.kafka import interleave

    monkeypatch.setattr(interleave, "PER_PARTITION", 40)
    b = kafka_broker.bootstrap
    topic, kafka = create_topic(b, 4), el.Kafka(b)
    want = backlog(b, topic)
    app, agg = ingest(tmp_path / "paused.db", kafka, topic, order="time", batch_size=25)
    log = [(e.data["robot"], e.data["ts"]) for e in app.store.iter_events()]
    assert [ts for _, ts in log] == sorted(ts for _, ts in log)
    assert Counter(log) == Counter(
        (f"r{p}", BASE_MS + i * STEP_MS) for p in range(4) for i in range(PER_PARTITION)
    )  # fmt: skip
    assert agg.window_counts()["late"] == 0
    got = {(r, w.start_us): w.value["n"] for r in ("r0", "r1", "r2", "r3") for w in agg.windows(r)}
    assert got == dict(want)


def test_order_is_checked(tmp_path: Path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(el.InvalidInputError, match="order must be 'arrival' or 'time', got 'x'"):
        app.ingest("in", el.Kafka("127.0.0.1:9"), topic="t", order="x")  # type: ignore[arg-type]


class Message:
    """A record as the consumer hands it out: only what the time order reads of it."""

    def __init__(self, offset: int, ts: int) -> None:
        self._offset, self._ts = offset, ts

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)


def test_the_time_order_waits_only_for_held_partitions_with_records_on_the_way() -> None:
    from eventlanes.kafka.interleave import TimeOrder

    order = TimeOrder()
    order.add({0: [Message(0, 10), Message(1, 30)], 1: [Message(5, 20)], 3: [Message(0, 1)]})
    live = {0: False, 1: True, 2: True}
    # partition 2 has records on the way and none buffered: nothing is taken yet
    assert order.take([0, 1, 2], lambda p: live[p], 100) == ({}, [])
    order.at_end(2, 7)  # the consumer reached its end (a topic of transactions never
    live[2] = False  # reaches its high watermark): no longer waited for
    assert order.next_offset(2, 3) == 7 and order.next_offset(0, 0) == 2
    order.add({4: [Message(0, 1)]})
    order.at_end(4, 2)  # its end came in the read that brought offset 0 (1 is a marker):
    assert order.next_offset(4, 0) == 2  # read to the end, though offset 1 never comes
    order.buffers.pop(4)
    order.buffered -= 1
    taken, seq = order.take([0, 1, 2], lambda p: live[p], 100)
    # partition 3 is no longer held: its records are dropped, never handed out; partition 1
    # is live once its buffer is empty, so the batch stops there
    assert seq == [(0, 0), (1, 5)] and 3 not in order.buffers
    assert {p: [m.offset() for m in ms] for p, ms in taken.items()} == {0: [0], 1: [5]}
    order.add({1: [Message(5, 20), Message(6, 40)]})  # a read again of offset 5 is passed over
    taken, seq = order.take([0, 1, 2], lambda p: live[p], 100)
    assert seq == [(0, 1), (1, 6)]
