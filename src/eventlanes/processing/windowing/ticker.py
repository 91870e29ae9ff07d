"""The ticker of a windowed aggregation with ``idle_close=``: once this worker has read no input
and no tick for that long, with windows open, it appends one tick
(:mod:`eventlanes.windows.ticks`), so the clock moves and the windows its inputs left open
close. Every worker of the aggregation has one;
each appends at the tick stream's version it read, so workers that find the store quiet at
once append one tick between them."""

from __future__ import annotations

import logging
import time

from ...errors import ConcurrencyError
from ...events import NewEvent
from ...store.base import EventStore
from ...windows.ticks import TICK, TICK_STREAM

log = logging.getLogger("eventlanes.windows")


class Ticker:
    def __init__(self, store: EventStore, idle_close_us: int, name: str) -> None:
        self.store, self.name = store, name
        self.every = idle_close_us / 1e6
        self.quiet_since = time.monotonic()

    def heard(self) -> None:
        """An input or a tick was read: the quiet starts again."""
        self.quiet_since = time.monotonic()

    def check(self) -> None:
        """Append a tick if the quiet has lasted ``idle_close`` (one try per quiet spell: a
        tick appended here, or by another worker, is read and starts a new one)."""
        now = time.monotonic()
        if now - self.quiet_since < self.every:
            return
        self.quiet_since = now
        self.append(self.store.stream_version(TICK_STREAM))

    def append(self, version: int) -> bool:
        """Append a tick if the tick stream is still at ``version`` (else another worker's
        tick came since: it is read as this one would be)."""
        try:
            self.store.append(TICK_STREAM, [NewEvent(TICK, {})], expected_version=version)
        except ConcurrencyError:
            return False
        log.debug("aggregation %r: no input for %.1f s, a tick appended", self.name, self.every)
        return True
