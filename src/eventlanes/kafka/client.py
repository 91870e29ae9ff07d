"""The Kafka client, as the rest of the package uses it: consumers and admin clients built
from the settings, topic descriptions, watermarks, and which client errors pass (weather).

The client's own log lines go to the ``eventlanes.kafka.client`` logger (never to stderr
directly), so a broker that is down is told once by the runner, not on every reconnect.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from .settings import Kafka, KafkaUnavailableError, client_module

client_log = logging.getLogger("eventlanes.kafka.client")
client_log.setLevel(logging.CRITICAL)  # reconnect chatter: the runners report outages once


class TopicMissingError(InvalidInputError):
    """The topic does not exist (at start: a user error; while running: deleted, waited for)."""


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic: str
    partitions: list[int]
    topic_id: str | None


def _quiet(conf: dict[str, Any]) -> dict[str, Any]:
    conf = dict(conf)
    conf.setdefault("logger", client_log)
    return conf


#: the code of the event a consumer with ``enable.partition.eof`` gives at a partition's end
PARTITION_EOF = -191  # confluent_kafka.KafkaError._PARTITION_EOF


def consumer(kafka: Kafka, **extra: Any) -> Any:
    ck = client_module()
    conf = _quiet(kafka.consumer_config())
    conf.update(extra)
    return ck.Consumer(conf)


def producer(kafka: Kafka, **extra: Any) -> Any:
    ck = client_module()
    conf = _quiet(kafka.producer_config())
    conf.update(extra)
    return ck.Producer(conf)


def admin(kafka: Kafka) -> Any:
    """The client that describes topics. Asking about a topic must never create it: librdkafka
    lets an admin client (a producer inside) ask for that by default, and a broker that
    creates topics it is asked about (Kafka's default ``auto.create.topics.enable``, Tansu)
    would answer a misspelt or deleted topic with a new one."""
    ck = client_module()
    from confluent_kafka.admin import AdminClient

    del ck
    conf = _quiet(kafka.resolved())
    conf["allow.auto.create.topics"] = False
    return AdminClient(conf)


def is_transient(exc: BaseException) -> bool:
    """Client errors that a broker coming back cures: transport, timeouts, no leader yet."""
    if isinstance(exc, KafkaUnavailableError):
        return True
    ck = client_module()
    if not isinstance(exc, ck.KafkaException):
        return False
    err = exc.args[0] if exc.args else None
    if err is None or not hasattr(err, "code"):
        return False
    if err.fatal():
        return False
    return bool(err.retriable()) or err.code() in _TRANSIENT_CODES(ck)


def _TRANSIENT_CODES(ck: Any) -> set[int]:  # noqa: N802 - a constant, built lazily
    e = ck.KafkaError
    return {e._TRANSPORT, e._ALL_BROKERS_DOWN, e._TIMED_OUT, e._RESOLVE, e._MSG_TIMED_OUT,
            e.REQUEST_TIMED_OUT, e.NOT_LEADER_FOR_PARTITION, e.LEADER_NOT_AVAILABLE,
            e._WAIT_COORD, e.NETWORK_EXCEPTION, e._NOENT}  # fmt: skip


def describe(kafka: Kafka, topic: str, client: Any, timeout: float) -> TopicInfo:
    """The topic's partitions (and id). KafkaUnavailableError when the broker does not answer
    in ``timeout`` seconds; InvalidInputError when the topic does not exist."""
    ck = client_module()
    try:
        meta = client.list_topics(topic, timeout=timeout)
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(
            f"Kafka broker(s) {kafka.bootstrap_servers} did not answer within {timeout:g} s: "
            f"{exc.args[0].str() if exc.args else exc}"
        ) from None
    found = meta.topics.get(topic)
    if found is None or found.error is not None:
        code = found.error.code() if found is not None and found.error is not None else None
        if code in (ck.KafkaError.UNKNOWN_TOPIC_OR_PART, None):
            raise TopicMissingError(
                f"Kafka topic {topic!r} does not exist on {kafka.bootstrap_servers}"
            )
        raise KafkaUnavailableError(f"Kafka topic {topic!r}: {found.error.str()}")
    return TopicInfo(topic, sorted(found.partitions), None)


def topics(kafka: Kafka, client: Any, timeout: float) -> dict[str, list[int]]:
    """Every topic of the cluster and its partitions (one metadata request, naming no topic:
    nothing is created on a broker that creates topics it is asked about)."""
    ck = client_module()
    try:
        meta = client.list_topics(timeout=timeout)
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(
            f"Kafka broker(s) {kafka.bootstrap_servers} did not answer within {timeout:g} s: "
            f"{exc.args[0].str() if exc.args else exc}"
        ) from None
    return {name: sorted(t.partitions) for name, t in meta.topics.items() if t.error is None}


def topic_id(kafka: Kafka, topic: str, admin_client: Any, timeout: float) -> str | None:
    """The topic's id (changes when a topic is deleted and created again); None when the
    broker does not say."""
    ck = client_module()
    try:
        futures = admin_client.describe_topics(ck.TopicCollection([topic]), request_timeout=timeout)
        description = futures[topic].result(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - older brokers: no topic ids, no check
        if is_transient(exc):
            raise KafkaUnavailableError(f"describing topic {topic!r} failed: {exc}") from None
        return None
    tid = getattr(description, "topic_id", None)
    text = None if tid is None else str(tid)
    return text if text and text.strip("A=") else None  # the all-zero id means "none"


def low_watermark(consumer_client: Any, topic: str, partition: int, timeout: float) -> int:
    """The partition's first offset on the broker (ListOffsets earliest)."""
    ck = client_module()
    try:
        low, _high = consumer_client.get_watermark_offsets(
            ck.TopicPartition(topic, partition), timeout=timeout
        )
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(f"offsets of {topic}[{partition}]: {exc}") from None
    return int(low)


def latest_offset(consumer_client: Any, topic: str, partition: int, timeout: float) -> int:
    ck = client_module()
    try:
        _low, high = consumer_client.get_watermark_offsets(
            ck.TopicPartition(topic, partition), timeout=timeout
        )
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(f"offsets of {topic}[{partition}]: {exc}") from None
    return int(high)


def high_watermarks(kafka: Kafka, topic: str, timeout: float) -> dict[int, int]:
    """Each partition's high watermark now, as a fetch reports it (ListOffsets latest can be
    short of it on some brokers: Tansu's answers the last batch's base offset + 1), read from
    the last batch on so that little is fetched."""
    ck = client_module()
    partitions = describe(kafka, topic, admin(kafka), timeout).partitions
    reader = consumer(kafka)
    try:
        starts = {}
        for p in partitions:
            low = low_watermark(reader, topic, p, timeout)
            starts[p] = max(0, low, latest_offset(reader, topic, p, timeout) - 1)
        reader.assign([ck.TopicPartition(topic, p, starts[p]) for p in partitions])
        highs: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while len(highs) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(highs))
                raise KafkaUnavailableError(
                    f"no high watermark of {topic} partition(s) {missing} within {timeout:g} s"
                )
            reader.consume(1000, timeout=0.1)
            for p in partitions:
                _low, high = reader.get_watermark_offsets(ck.TopicPartition(topic, p), cached=True)
                if high >= 0:
                    highs[p] = int(high)
        return highs
    finally:
        reader.close()
