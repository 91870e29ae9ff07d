"""Root offsets of trusted chains, checked against the topics of the ingesting cluster.

A trusted chain's root names the record everything after it descends from. A root naming
offset 10**15 of a topic would make an aggregation drop every genuine input of that source
as already folded in, until the real offsets got there. Where the root names a topic of the
cluster the ingestor reads, that offset must be one the partition has already reached:
below its high watermark. A root naming a source this cluster does not have (another
cluster's topic, an upstream store's events) is taken on the trust ``trust_chains`` gives.
"""

from __future__ import annotations

import time
from typing import Any

from . import client
from .settings import Kafka

#: how long "no such topic here" is believed before the cluster is asked again
MISSING_FOR = 60.0


class RootOffsets:
    """``check(source, partition, offset)``: None when the root may be carried on, else why
    not. Asks the broker only for what it has not seen: the high watermarks it knows are
    lower bounds (a partition only grows), so a root below one needs no question."""

    def __init__(self, kafka: Kafka, timeout: float) -> None:
        self.kafka = kafka
        self.timeout = timeout
        self._partitions: dict[str, list[int]] = {}
        self._listed = -MISSING_FOR  # when the cluster's topics were last listed
        self._highs: dict[tuple[str, int], int] = {}
        self._admin: Any = None

    def check(self, source: str, partition: str, offset: int) -> str | None:
        if offset < self._highs.get((source, _number(partition)), 0):
            return None  # the common case: an offset already known to exist
        partitions = self._topic(source)
        if partitions is None:
            return None  # not a topic of this cluster: nothing to compare with
        number = _number(partition)
        if number not in partitions and number >= 0:
            partitions = self._topic(source, again=True) or []  # partitions added since?
        if number not in partitions:
            return (f"names partition {partition!r} of topic {source!r} as its root, which has "
                    f"partitions 0 to {max(partitions)}")  # fmt: skip
        for p, high in client.high_watermarks(self.kafka, source, self.timeout).items():
            self._highs[source, p] = max(high, self._highs.get((source, p), 0))
        high = self._highs.get((source, number), 0)
        if offset < high:
            return None
        return (
            f"names offset {offset:,} of {source}[{number}] as its root, an offset that "
            f"partition has not reached (its high watermark is {high:,}): a forged root "
            "would make aggregations drop that source's genuine inputs as duplicates"
        )

    def _topic(self, topic: str, again: bool = False) -> list[int] | None:
        """The partitions of ``topic`` on this cluster; None if it has no such topic (the
        list of topics is asked again after :data:`MISSING_FOR` seconds, or ``again``)."""
        now = time.monotonic()
        if again or (topic not in self._partitions and now - self._listed >= MISSING_FOR):
            if self._admin is None:
                self._admin = client.admin(self.kafka)
            self._partitions = client.topics(self.kafka, self._admin, self.timeout)
            self._listed = now
        return self._partitions.get(topic)


def _number(partition: str) -> int:
    """A hop's partition as eventlanes writes a Kafka one (``str(int)``); -1 otherwise."""
    return int(partition) if partition.isdecimal() and str(int(partition)) == partition else -1
