"""A test app with one Kafka ingestor, for the CLI and worker processes.

Reads EVENTLANES_TEST_KAFKA_URL (the store), EVENTLANES_TEST_KAFKA_BOOTSTRAP, _TOPIC,
_ON_BAD (default "stop"), _TIMEOUT (seconds the broker has to answer, default 10), _BATCH and
_CLAIM_TIMEOUT. Records are JSON values keyed by stream; the type is the ``type`` header or,
without one, "Reading".
"""

from __future__ import annotations

import os

import eventlanes as el
from eventlanes.kafka import Record

env = os.environ.get


def event_type(record: Record) -> str:
    raw = record.header("type")
    return raw.decode() if raw is not None else "Reading"


def make_app(url: str, bootstrap: str, topic: str, **options: object) -> el.App:
    app = el.App(url, claim_timeout=float(env("EVENTLANES_TEST_KAFKA_CLAIM_TIMEOUT", "1.5")))
    kafka = el.Kafka(bootstrap, timeout=float(env("EVENTLANES_TEST_KAFKA_TIMEOUT", "10")))
    app.ingest("readings-in", kafka, topic=topic, type=event_type, **options)  # type: ignore[arg-type]
    return app


app = make_app(
    env("EVENTLANES_TEST_KAFKA_URL", "sqlite:///kafka-test.db"),
    env("EVENTLANES_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
    env("EVENTLANES_TEST_KAFKA_TOPIC", "readings"),
    on_bad=env("EVENTLANES_TEST_KAFKA_ON_BAD", "stop"),
    batch_size=int(env("EVENTLANES_TEST_KAFKA_BATCH", "2000")),
)
