"""An ingestor's definition: which topic, how records become events, what to do with bad ones.

``app.ingest("readings-in", el.Kafka("broker:9092"), topic="readings", type="Reading")``.
Every option is checked here, where the user writes it; nothing connects until it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InvalidInputError
from ..lineage import MAX_NAME
from ..names import validate_processor_name
from .records import DEFAULT_MAX_BYTES, Converter, Record, Trust
from .roots import RootOffsets
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


def trusted(names: object, topic: str, who: str) -> Trust:
    """``trust_chains`` checked: None, False, or a list of source names (a topic, an
    aggregation, a store's events table), never the topic read itself."""
    if names is None or names is False:
        return names
    if isinstance(names, str | bytes) or not isinstance(names, list | tuple | set | frozenset):
        raise InvalidInputError(
            f"{who}: trust_chains is a list of upstream source names, or False, got {names!r}"
        )
    out = tuple(sorted(names)) if isinstance(names, set | frozenset) else tuple(names)
    for n in out:
        # ':' separates an aggregation from its key in a stage's root: a name is matched
        # whole or as the part before it
        if not isinstance(n, str) or not 0 < len(n) <= MAX_NAME or ":" in n:
            raise InvalidInputError(f"{who}: trust_chains: {n!r} is not a source name (1 to "
                                    f"{MAX_NAME} characters, no ':')")  # fmt: skip
    if not out:
        raise InvalidInputError(f"{who}: trust_chains names no source (pass False to ignore "
                                "chains)")  # fmt: skip
    if topic in out:
        raise InvalidInputError(f"{who}: trust_chains names the topic it reads ({topic!r}): a "
                                "record cannot descend from its own topic")  # fmt: skip
    return out


class Ingestor:
    """Appends a topic's records to the store, exactly once: one token per partition (the next
    offset to append), written in the transaction of the append.

    ``stream``: record -> stream id (default: the key as text); ``type``: a fixed type, or
    record -> type (default: the ``type`` header); ``decode``: value bytes -> dict (default:
    a JSON object); ``on_bad``: ``"stop"`` (default: the partition stops at a bad record, the
    reason in ``status``) or ``"dead_letter"`` (the record, and every later record of its
    stream, is parked; the rest goes on); ``initial``: where a partition the ingestor has
    never read starts, ``"earliest"`` (default) or ``"latest"``; ``batch_size``: records per
    transaction at most; ``order``: ``"arrival"`` (default: each batch a partition after
    another, as read) or ``"time"`` (the partitions' records interleaved by their timestamps,
    as Kafka Streams takes them: for windows decided by the store's clock, over a backlog);
    ``max_record_bytes``: larger records are bad; ``max_partitions``:
    at most this many partitions per process (besides the fair share); ``trust_chains``: what
    a record's ``el-source-chain`` header (written by an eventlanes sink upstream) does: not
    given, such a record is bad (a chain is an input: a forged root would make an aggregation
    drop genuine inputs as duplicates); ``False``, the header is ignored (each record is its
    own root); or the names of the upstream root sources whose chains are carried on (a name
    also covers the stages of an aggregation of that name, ``name:key``), every hop checked,
    and never a root naming the topic read or this store's own events; ``check_roots``
    (default True): a trusted root naming a topic of this cluster must be an offset its
    partition has reached (False where a topic here only shares the source's name: a
    mirror)."""

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
        order: Literal["arrival", "time"] = "arrival",
        max_record_bytes: int = DEFAULT_MAX_BYTES,
        max_partitions: int | None = None,
        trust_chains: Any = None,
        check_roots: bool = True,
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
        if order not in ("arrival", "time"):
            raise InvalidInputError(
                f"ingestor {name!r}: order must be 'arrival' or 'time', got {order!r}"
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
        self.order = order
        self.max_partitions = max_partitions
        self.trust_chains = trusted(trust_chains, topic, f"ingestor {name!r}")
        if not isinstance(check_roots, bool):
            raise InvalidInputError(f"ingestor {name!r}: check_roots is True or False, got "
                                    f"{check_roots!r}")  # fmt: skip
        self.check_roots = check_roots
        self.converter = Converter(
            topic, stream, type, decode, max_record_bytes, self.trust_chains,
            lambda: runtime.store.events_table,  # resolved when a chain comes: nothing opens here
            RootOffsets(kafka, kafka.timeout).check if self.trust_chains and check_roots else None,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"Ingestor({self.name!r}, topic={self.topic!r}, {self.kafka!r})"
