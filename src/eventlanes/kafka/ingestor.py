"""An ingestor's definition: which topic, how records become events, what to do with bad ones.

``app.ingest("readings-in", el.Kafka("broker:9092"), topic="readings", type="Reading")``.
Every option is checked here, where the user writes it; nothing connects until it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InvalidInputError
from ..names import validate_processor_name
from .records import DEFAULT_MAX_BYTES, Converter, Record
from .settings import Kafka

if TYPE_CHECKING:
    from ..processing.runtime import Runtime

OnBad = Literal["stop", "dead_letter"]
_TOPIC = re.compile(r"[A-Za-z0-9._\-]{1,249}")
MAX_BATCH = 100_000


def valid_topic(topic: object, who: str) -> str:
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise InvalidInputError(
            f"{who}: invalid topic {topic!r} (1-249 letters, digits, '.', '_', '-')"
        )
    return topic


class Ingestor:
    """Appends a topic's records to the store, exactly once: one token per partition (the next
    offset to append), written in the transaction of the append.

    ``stream``: record -> stream id (default: the key as text); ``type``: a fixed type, or
    record -> type (default: the ``type`` header); ``decode``: value bytes -> dict (default:
    a JSON object); ``on_bad``: ``"stop"`` (default: the partition stops at a bad record, the
    reason in ``status``) or ``"dead_letter"`` (the record, and every later record of its
    stream, is parked; the rest goes on); ``initial``: where a partition the ingestor has
    never read starts, ``"earliest"`` (default) or ``"latest"``; ``batch_size``: records per
    transaction at most; ``max_record_bytes``: larger records are bad; ``max_partitions``:
    at most this many partitions per process (besides the fair share)."""

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        kafka: Kafka,
        *,
        topic: str,
        stream: Callable[[Record], str] | None = None,
        type: str | Callable[[Record], str] | None = None,  # noqa: A002 - the user's word
        decode: Callable[[bytes | None], Any] | None = None,
        on_bad: OnBad = "stop",
        initial: Literal["earliest", "latest"] = "earliest",
        batch_size: int = 2000,
        max_record_bytes: int = DEFAULT_MAX_BYTES,
        max_partitions: int | None = None,
    ) -> None:
        self.runtime = runtime
        self.name = validate_processor_name(name)
        if not isinstance(kafka, Kafka):
            raise InvalidInputError(f"ingestor {name!r}: pass the connection as el.Kafka(...)")
        valid_topic(topic, f"ingestor {name!r}")
        for what, fn in (("stream", stream), ("decode", decode)):
            if fn is not None and not callable(fn):
                raise InvalidInputError(f"ingestor {name!r}: {what}= must be a function")
        if type is not None and not (callable(type) or (isinstance(type, str) and type)):
            raise InvalidInputError(
                f"ingestor {name!r}: type= is an event type name or a function of the record"
            )
        if on_bad not in ("stop", "dead_letter"):
            raise InvalidInputError(
                f"ingestor {name!r}: on_bad must be 'stop' or 'dead_letter', got {on_bad!r}"
            )
        if initial not in ("earliest", "latest"):
            raise InvalidInputError(
                f"ingestor {name!r}: initial must be 'earliest' or 'latest', got {initial!r}"
            )
        limits = (("batch_size", batch_size, 1, MAX_BATCH),
                  ("max_record_bytes", max_record_bytes, 1, 2**31))  # fmt: skip
        for what, value, low, high in limits:
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidInputError(
                    f"ingestor {name!r}: {what} must be a whole number from {low} to {high}, "
                    f"got {value!r}"
                )
        if max_partitions is not None and (
            isinstance(max_partitions, bool) or not isinstance(max_partitions, int)
            or max_partitions < 1
        ):  # fmt: skip
            raise InvalidInputError(f"ingestor {name!r}: max_partitions must be >= 1")
        self.kafka = kafka
        self.topic = topic
        self.on_bad: OnBad = on_bad
        self.initial = initial
        self.batch_size = batch_size
        self.max_partitions = max_partitions
        self.converter = Converter(topic, stream, type, decode, max_record_bytes)

    def __repr__(self) -> str:
        return f"Ingestor({self.name!r}, topic={self.topic!r}, {self.kafka!r})"
