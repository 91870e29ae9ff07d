"""The store's clock of a windowed aggregation in this process: the largest (clamped) event
time of its inputs up to each position, read from the log, shared by the segments it holds.

``W(p)``, the watermark, is that time less the lateness: an input at ``p`` is late for a
window ending at or before ``W(p - 1)``, and a window closes at the first position where
``W`` reaches its end. A function of the log alone, so the same for any segment count, after
splits and merges and on every replay. Only the positions where the largest time grows are
kept, and only from the lowest token held on; a segment's write stores the clock at its
token (:mod:`eventlanes.schema.v5_windows`), the start of the next read of the clock there.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from ...errors import InvalidInputError
from ...events import Event, recorded_raw
from ...store.base import EventStore
from ...windows.spec import Windowing
from ...windows.time import clamped, datetime_micros

#: events read at a time by the clock
CLOCK_BATCH = 5000


def recorded_us(event: Event) -> int:
    raw = recorded_raw(event)
    return raw if isinstance(raw, int) else datetime_micros(raw)


class StoreClock:
    """``start(position)``: a (position, latest) checkpoint at or below ``position``."""

    def __init__(
        self,
        store: EventStore,
        types: frozenset[str] | None,
        spec: Windowing,
        start: Callable[[int], tuple[int, int | None]],
    ) -> None:
        self.store, self.types, self.spec, self.start = store, types, spec, start
        self.lock = threading.Lock()
        self.base: int | None = None  # the position the kept changes start after
        self.base_latest: int | None = None  # the largest time up to ``base``
        self.positions: list[int] = []  # where the largest time grew, in order
        self.latest: list[int] = []  # the largest time from there on (increasing)
        self.scanned = 0  # the clock is known up to here

    def cover(self, after: int, upto: int) -> None:
        """Know the clock at every position in ``(after, upto]`` (``upto`` a position the
        readers reached: nothing can still be committed below it)."""
        with self.lock:
            if self.base is None or after < self.base:
                self.base, self.base_latest = self.start(after)
                self.positions, self.latest = [], []
                self.scanned = self.base
            if upto > self.scanned:
                self._scan(self.scanned, upto)
                self.scanned = upto

    def _scan(self, after: int, upto: int) -> None:
        spec = self.spec
        running = self.latest[-1] if self.latest else self.base_latest
        types = sorted(self.types) if self.types is not None else None
        for event in self.store.iter_events(after, CLOCK_BATCH, until=upto, types=types):
            try:
                t = spec.time.of(event)
            except InvalidInputError:  # its own segment fails on it (retried or parked)
                continue
            t, _ = clamped(t, recorded_us(event), spec.max_future)
            if running is None or t > running:
                running = t
                self.positions.append(event.position)
                self.latest.append(t)

    def _at(self, i: int) -> int | None:
        return self.latest[i - 1] if i else self.base_latest

    def before(self, positions: list[int]) -> list[int | None]:
        """The largest time before each of ``positions`` (None: no time yet)."""
        with self.lock:
            return [self._at(bisect_left(self.positions, p)) for p in positions]

    def at(self, position: int) -> int | None:
        """The largest time up to ``position`` (covered)."""
        with self.lock:
            return self._at(bisect_right(self.positions, position))

    def reached(self, time: int) -> int:
        """The first position where the largest time reached ``time`` (it has)."""
        with self.lock:
            if self.base is not None and self.base_latest is not None and self.base_latest >= time:
                return self.base
            i = bisect_left(self.latest, time)
            return self.positions[i] if i < len(self.positions) else self.scanned

    def trim(self, lowest: int) -> None:
        """Forget the changes at or below ``lowest``: no segment held asks there."""
        with self.lock:
            if self.base is None or lowest <= self.base:
                return
            i = bisect_right(self.positions, lowest)
            if i:
                self.base_latest = self.latest[i - 1]
                del self.positions[:i], self.latest[:i]
            self.base = min(lowest, self.scanned)
