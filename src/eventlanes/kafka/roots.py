"""Root offsets of trusted chains, checked against the topics of the ingesting cluster.

A trusted chain's root names the record everything after it descends from. A root naming
offset 10**15 of a topic would make an aggregation drop every genuine input of that source
as already folded in, until the real offsets got there. Where the root names a topic of the
cluster the ingestor reads, that offset must be one the partition has already reached:
below its high watermark. A root naming a source this cluster does not have (another
cluster's topic, an upstream store's events) is taken on the trust ``trust_chains`` gives;
so is every root with ``check_roots=False`` (a topic here that only shares the name of the
root's source: a mirror, whose offsets differ).
"""

from __future__ import annotations

import time
from typing import Any

from . import client
from .settings import Kafka

#: how long "no such topic here" is believed before the cluster is asked again
MISSING_FOR = 60.0
#: said with every refusal: a topic of the same name that is not the source (a mirror)
ADVICE = ("where a topic of this cluster only shares the name of the root's source, a mirror "
          "say, pass check_roots=False to the ingestor")  # fmt: skip


class RootOffsets:
    """``check(source, partition, offset)``: None when the root may be carried on, else why
    not. Asks the broker only for what it has not seen: the high watermarks it knows are
    lower bounds (a partition only grows), so a root below one needs no question; then the
    partition's latest offset (one ListOffsets request, on a client kept for it), and only if
    that is not past the root, the high watermark as a fetch reports it (some brokers answer
    ListOffsets with less: Tansu's is the last batch's base offset + 1)."""

    def __init__(self, kafka: Kafka, timeout: float) -> None:
        self.kafka = kafka
        self.timeout = timeout
        self._partitions: dict[str, list[int]] = {}
        self._listed = -MISSING_FOR  # when the cluster's topics were last listed
        self._highs: dict[tuple[str, int], int] = {}
        self._admin: Any = None
        self._consumer: Any = None

    def check(self, source: str, partition: str, offset: int) -> str | None:
        number = _number(partition)
        if number < 0:
            return None  # not a Kafka partition (a store's or a stage's root): no topic
        if offset < self._highs.get((source, number), 0):
            return None  # the common case: an offset already known to exist
        partitions = self._topic(source)
        if partitions is None:
            return None  # not a topic of this cluster: nothing to compare with
        if number not in partitions:
            partitions = self._topic(source, again=True)  # partitions added since?
            if partitions is None:
                return None  # deleted meanwhile
        if number not in partitions:
            return (f"names partition {partition!r} of topic {source!r} as its root, which has "
                    f"partitions 0 to {max(partitions)} ({ADVICE})")  # fmt: skip
        try:
            high = self._high(source, number, offset)
        except client.TopicMissingError:  # deleted meanwhile: nothing to compare with
            self._partitions.pop(source, None)
            return None
        if offset < high:
            return None
        return (
            f"names offset {offset:,} of {source}[{number}] as its root, an offset that "
            f"partition has not reached (its high watermark is {high:,}): a forged root would "
            f"make aggregations drop that source's genuine inputs as duplicates ({ADVICE})"
        )

    def _high(self, topic: str, partition: int, offset: int) -> int:
        if self._consumer is None:
            self._consumer = client.consumer(self.kafka)
        latest = client.latest_offset(self._consumer, topic, partition, self.timeout)
        self._highs[topic, partition] = max(latest, self._highs.get((topic, partition), 0))
        if offset >= latest:
            for p, high in client.high_watermarks(self.kafka, topic, self.timeout).items():
                self._highs[topic, p] = max(high, self._highs.get((topic, p), 0))
        return self._highs.get((topic, partition), 0)

    def _topic(self, topic: str, again: bool = False) -> list[int] | None:
        """The partitions of ``topic`` on this cluster; None if it has no such topic (the
        list of topics is asked again after :data:`MISSING_FOR` seconds, or ``again``)."""
        now = time.monotonic()
        if again or (topic not in self._partitions and now - self._listed >= MISSING_FOR):
            if self._admin is None:
                self._admin = client.admin(self.kafka)
            self._partitions = client.topics(self.kafka, self._admin, self.timeout)
            self._listed = now
        found = self._partitions.get(topic)
        return found or None


def _number(partition: str) -> int:
    """A hop's partition as eventlanes writes a Kafka one (``str(int)``); -1 otherwise."""
    return int(partition) if partition.isdecimal() and str(int(partition)) == partition else -1
