"""The records of several partitions handed out in time order (``order="time"``), as Kafka
Streams picks the record with the smallest timestamp among its partitions' heads.

An ingestor reading a backlog gets it about a partition at a time (as the broker hands it
out); appended so, the first partition's records run ahead in event time and a windowed
aggregation's store clock calls the others' late. Here each partition's records wait in a
buffer, and a batch takes the smallest-timestamped head while every partition that still has
records on the broker (``live``) has one buffered: each partition stays in offset order, and
the log in timestamp order across them. A partition whose records do not come is waited for
only while reads are quiet for less than :data:`IDLE` seconds; a partition with
:data:`PER_PARTITION` records buffered is paused (as Kafka Streams does), and the buffers hold
at most :data:`MAX_BUFFERED` records, so memory stays bounded and the ingestor moves on.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: seconds of reads that bring nothing before a partition with records on the broker that
#: have not come is passed over (its records then come later in the log)
IDLE = 2.0
#: records buffered per partition before it is paused (the broker then hands out the
#: others': it may send a backlog a partition after another); resumed when half of it is left
PER_PARTITION = 10_000
#: records buffered at most: past it, a batch takes what is there (memory stays bounded)
MAX_BUFFERED = 100_000


def timestamp(message: Any) -> int:
    """A record's timestamp in ms (-1 without one: such records go first)."""
    kind, ts = message.timestamp()
    return ts if kind else -1


class TimeOrder:
    def __init__(self) -> None:
        self.buffers: dict[int, deque[Any]] = {}
        #: per partition, the offset after the last record read (buffered or taken since)
        self.next: dict[int, int] = {}
        #: per partition, the offset of the end the consumer last reported (a topic written
        #: in transactions never has a record at its high watermark: its last offset is a
        #: commit marker, which the consumer does not hand out)
        self.ended: dict[int, int] = {}
        self.buffered = 0
        self.quiet_since: float | None = None

    def reset(self) -> None:
        """Forget what is buffered (the consumer is rebuilt at the tokens: it reads it again)."""
        self.buffers.clear()
        self.next.clear()
        self.ended.clear()
        self.buffered = 0

    def add(self, batch: dict[int, list[Any]]) -> None:
        """Records just read, by partition (each in offset order); one read already buffered
        is passed over."""
        if not batch:
            self.quiet_since = self.quiet_since or time.monotonic()
            return
        self.quiet_since = None
        for p, messages in batch.items():
            after = self.next.get(p, 0)
            fresh = [m for m in messages if m.offset() >= after]
            if fresh:
                self.buffers.setdefault(p, deque()).extend(fresh)
                self.buffered += len(fresh)
                self.next[p] = fresh[-1].offset() + 1

    def pacing(self, paused: set[int]) -> tuple[list[int], list[int]]:
        """The partitions to pause (their buffers full) and to resume (of ``paused``, those
        with half their room free again)."""
        sizes = {p: len(b) for p, b in self.buffers.items()}
        full = [p for p, n in sizes.items() if n >= PER_PARTITION and p not in paused]
        room = [p for p in paused if sizes.get(p, 0) < PER_PARTITION // 2]
        return full, room

    def at_end(self, p: int, offset: int) -> None:
        """The consumer reached the end of partition ``p``, at ``offset``."""
        self.ended[p] = max(self.ended.get(p, 0), offset)

    def next_offset(self, p: int, token: int) -> int:
        """How far partition ``p`` is read: the next offset not read yet (its token before
        any), or the end the consumer reported, if further."""
        return max(self.next.get(p, token), self.ended.get(p, 0))

    def take(
        self, partitions: list[int], live: Callable[[int], bool], limit: int
    ) -> tuple[dict[int, list[Any]], list[tuple[int, int]]]:
        """Up to ``limit`` records in timestamp order, by partition, and their (partition,
        offset) in that order: while each of ``partitions`` that is ``live`` (records on the
        broker not buffered yet) has one buffered, unless reads have been quiet for
        :data:`IDLE` or the buffers are full."""
        for gone in [p for p in self.buffers if p not in partitions]:  # no longer held
            self.buffered -= len(self.buffers.pop(gone))
            self.next.pop(gone, None)
        waiting = not self._moving_on()
        taken: dict[int, list[Any]] = {}
        order: list[tuple[int, int]] = []
        if waiting and any(not self.buffers.get(p) and live(p) for p in partitions):
            return taken, order
        heads = [(timestamp(b[0]), p) for p, b in self.buffers.items() if b]
        heapq.heapify(heads)
        while heads and len(order) < limit:
            _, p = heapq.heappop(heads)
            buffer = self.buffers[p]
            m = buffer.popleft()
            self.buffered -= 1
            taken.setdefault(p, []).append(m)
            order.append((p, m.offset()))
            if buffer:
                heapq.heappush(heads, (timestamp(buffer[0]), p))
            elif waiting and live(p):  # its next record is on the broker: wait for it
                break
        return taken, order

    def _moving_on(self) -> bool:
        quiet = self.quiet_since is not None and time.monotonic() - self.quiet_since >= IDLE
        return quiet or self.buffered > MAX_BUFFERED
