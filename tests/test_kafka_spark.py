"""Reading a Kafka topic into Spark by offset ranges (the Kafka client on the executors), with
the count of what was read checked; a real broker (Tansu) and the session's Spark."""

from __future__ import annotations

import json

import pytest

import eventlanes as el
from eventlanes.spark.kafka import Range, read_topic
from tests.kafka_helpers import create_topic, produce, read_all


def test_topic_read_by_offset_ranges_equals_the_topic(spark, kafka_broker) -> None:
    b = kafka_broker.bootstrap
    topic = create_topic(b, 3)
    produce(b, topic, [(f"k{i % 11}", {"i": i}, [("type", b"T")]) for i in range(2500)])
    df, read = read_topic(spark, el.Kafka(b), topic, max_records=300)
    rows = df.collect()
    assert read.verify() == 2500 and read.total() == 2500
    assert len(read.ranges) > 3  # several ranges per partition
    expected = {
        (p, m.offset()): (m.key(), m.value())
        for p, recs in read_all(b, topic, 3).items()
        for m in recs
    }
    got = {(r.partition, r.offset): (bytes(r.key), bytes(r.value)) for r in rows}
    assert got == expected
    assert {json.loads(r.headers)["type"] for r in rows} == {"T"}


def test_a_read_short_of_its_plan_is_refused(spark, kafka_broker) -> None:
    """A range planned past what the broker has (the topic changed under the plan): the
    count falls short and verify() refuses, naming the range."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [("k", {"i": i}, None) for i in range(50)])
    df, read = read_topic(spark, el.Kafka(b), topic, ranges=[Range(0, 0, 0, 60)])
    assert df.count() == 50
    with pytest.raises(el.SparkJobError, match="partition 0 offsets 0..60: 50 record"):
        read.verify()
