"""Topics, producing and reading back, for the Kafka tests (a real broker: the session's
Tansu, ``kafka_broker`` in conftest.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import eventlanes as el
from tests.processing_helpers import wait_for


def create_topic(bootstrap: str, partitions: int, name: str | None = None) -> str:
    topic = name or f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(10)
    return topic


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and wait until the broker's metadata no longer lists it: a deletion
    completes after its request is answered (created again at once under load, the topic
    still existed: TOPIC_ALREADY_EXISTS)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(10)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics,
             what=f"topic {topic} deleted")  # fmt: skip


Rec = tuple[Any, Any, list[tuple[str, bytes]] | None]  # key, value, headers


def produce(bootstrap: str, topic: str, records: Iterable[Rec], partition: int | None = None,
            **config: Any) -> int:  # fmt: skip
    """Produce (idempotent, waits for every acknowledgement); keys and values that are not
    bytes are JSON (str keys as UTF-8)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, **config})  # fmt: skip
    failed: list[Any] = []
    n = 0
    for key, value, headers in records:
        k = key.encode() if isinstance(key, str) else key
        v = value if isinstance(value, bytes | None) else json.dumps(value).encode()
        kwargs: dict[str, Any] = {"key": k, "value": v, "headers": headers or None}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, on_delivery=lambda e, _m: e and failed.append(e), **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
        if n % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    return n


def read_all(
    bootstrap: str, topic: str, partitions: int, timeout: float = 30.0
) -> dict[int, list[Any]]:
    """Every record of each partition, in offset order (read until the fetched high
    watermark)."""
    out: dict[int, list[Any]] = {}
    for p in range(partitions):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                             "enable.auto.commit": False})  # fmt: skip
        consumer.assign([TopicPartition(topic, p, 0)])
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = consumer.consume(10_000, timeout=0.3)
            records += [m for m in batch if m.error() is None]
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            # Nothing read is the end only of an empty partition: a first fetch slower than
            # 0.3 s (a loaded machine) once ended it with nothing read (200,000 produced,
            # 100,000 seen: two partitions unchecked).
            reached = records[-1].offset() >= high - 1 if records else high == 0
            if high >= 0 and reached and not batch:
                break
        consumer.close()
        out[p] = records
    return out


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark as a fetch reports it (Tansu's ListOffsets latest can
    fall short: see eventlanes.testing.kafka)."""
    return {p: (recs[-1].offset() + 1 if recs else 0)
            for p, recs in read_all(bootstrap, topic, partitions).items()}  # fmt: skip


def run_until_ingested(app: el.App, events: int, timeout: float = 60.0) -> None:
    """Start ``app``, wait until its ingest has appended ``events`` events in all and its
    processors have folded them, and stop it, also when a wait fails."""
    app.start()
    try:
        wait_for(lambda: app.store.count() == events, timeout=timeout, what="ingested")
        app.wait_until_caught_up(timeout)
    finally:
        app.stop()
