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

import logging
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ...errors import InvalidInputError
from ...events import Event, decode_object, recorded_raw
from ...store.base import EventStore
from ...windows.spec import Windowing
from ...windows.ticks import TICK
from ...windows.time import datetime_micros

log = logging.getLogger("eventlanes.aggregation")

#: rows read at a time by the clock
CLOCK_BATCH = 5000
_POSITION = attrgetter("position")


def _time_in(spec: Windowing, data: Any) -> int | None:
    try:
        return spec.time.in_data(decode_object(data))
    except (InvalidInputError, ValueError):  # its segment fails on it
        return None


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
        #: position -> (clamped time, clamped?) of the inputs read above ``base``: the folds
        #: take them instead of reading each time again
        self.times: dict[int, tuple[int, bool]] = {}
        #: per segment using the clock, the lowest position it may still ask about (its token
        #: when it last asked): what is below all of them is forgotten (:meth:`trim`)
        self.floors: dict[int, int] = {}
        #: ranges ``(after, upto]`` known by their breaks only (:meth:`feed_breaks`), in order:
        #: read again before anyone asks inside one (:meth:`_refine`)
        self.coarse: list[tuple[int, int]] = []

    def cover(self, segment: int, after: int, upto: int) -> None:
        """Know the clock at every position in ``(after, upto]`` (``upto`` a position the
        readers reached: nothing can still be committed below it), for ``segment`` at
        ``after``."""
        with self.lock:
            self.floors[segment] = after
            self._cover(after, upto)

    def forget(self, segment: int) -> None:
        """``segment`` is let go: it asks nothing more."""
        with self.lock:
            self.floors.pop(segment, None)

    def _cover(self, after: int, upto: int) -> None:
        """:meth:`cover`, the lock held."""
        if self.base is None or after < self.base:
            self.base, self.base_latest = self.start(after)
            self.positions, self.latest, self.times, self.coarse = [], [], {}, []
            self.scanned = self.base
        if upto > self.scanned:
            self._scan(self.scanned, upto)
            self.scanned = upto

    def _scan(self, after: int, upto: int) -> None:
        spec, wanted = self.spec, self.types
        prop = spec.time.prop is not None
        # by position, a range of the table, the other types passed over here (a filter by
        # type walks the type index and reads each row apart); only the columns a time needs
        for rows in self.store.scan_times(after, upto, data=prop, chunk=CLOCK_BATCH):
            mine = [r for r in rows if wanted is None or r[1] in wanted]
            recorded = [r[3] for r in mine]
            times = [_time_in(spec, r[2]) for r in mine] if prop else list(recorded)
            self._add([r[0] for r in mine], self._ticked(times, mine, recorded), recorded)

    def feed(self, events: list[Event], after: int, upto: int) -> None:
        """``events``: every input after ``after`` up to ``upto`` (as the processor's reader
        read them, in order): the clock moves on to ``upto`` without reading them again, when
        it is known up to ``after`` at least (else the next :meth:`cover` reads)."""
        with self.lock:
            if self.base is None or not after <= self.scanned < upto:
                return
            scanned, wanted = self.scanned, self.types
            inputs = [
                e for e in events
                if scanned < e.position <= upto and (wanted is None or e.type in wanted)
            ]  # fmt: skip
            recorded = list(map(recorded_us, inputs))
            times = self._ticked(self.spec.time.times(inputs), inputs, recorded)
            self._add(list(map(_POSITION, inputs)), times, recorded)
            self.scanned = upto

    def feed_breaks(self, breaks: list[list[int]], after: int, upto: int) -> None:
        """The clock moves on from ``after`` to ``upto`` by a range folded in SQL
        (:mod:`.pushdown`): ``breaks``, ``[position, time]`` where the largest time grew,
        hold at least every first position where it reached a window's closing time and the
        last one where it grew, so :meth:`at` a range's end and :meth:`reached` for closing
        times answer as if every input was read. Taken when the clock is known up to
        ``after`` exactly (else the next :meth:`cover` reads); asked anything else inside
        the range, the clock reads it again first (:meth:`_refine`)."""
        with self.lock:
            if self.base is None or self.scanned != after or upto <= after:
                return
            running = self.latest[-1] if self.latest else self.base_latest
            for position, t in breaks:
                if running is None or t > running:
                    running = t
                    self.positions.append(position)
                    self.latest.append(t)
            self.scanned = upto
            self.coarse.append((after, upto))

    def _refine(self, low: int, high: int) -> None:
        """Read again, every input, the coarse ranges that meet ``(low, high)`` (the lock
        held): a range folded by rows after all asks the clock before each input, and a
        token may end inside one."""
        for after, upto in [r for r in self.coarse if r[0] < high and r[1] > low]:
            self.coarse.remove((after, upto))
            first = bisect_right(self.positions, after)
            last = bisect_right(self.positions, upto)
            tail = self.positions[last:], self.latest[last:]
            del self.positions[first:], self.latest[first:]
            self._scan(after, upto)
            self.positions += tail[0]
            self.latest += tail[1]

    def _ticked(
        self, times: list[int | None], rows: list[Any], recorded: list[int]
    ) -> list[int | None]:
        """``times`` with each tick's own (its ``recorded_at`` less ``tick_lag``): rows are
        events or scanned rows, their type read the same way."""
        if self.spec.idle_close is None:
            return times
        lag = self.spec.tick_lag
        for i, row in enumerate(rows):
            if (row.type if isinstance(row, Event) else row[1]) == TICK:
                times[i] = recorded[i] - lag
        return times

    def _add(self, positions: list[int], times: list[int | None], recorded: list[int]) -> None:
        """Inputs read, in order: their clamped times kept, the clock moved on (an input
        with no valid time moves nothing: its segment fails on it)."""
        future, kept = self.spec.max_future, self.times
        running = self.latest[-1] if self.latest else self.base_latest
        for position, t, at in zip(positions, times, recorded, strict=True):
            if t is None:
                continue
            bound = at + future
            was = t > bound
            if was:
                t = bound
            kept[position] = (t, was)
            if running is None or t > running:
                running = t
                self.positions.append(position)
                self.latest.append(t)

    def times_of(self, positions: list[int]) -> list[tuple[int, bool] | None]:
        """The clamped time of the input at each position and whether it was clamped, as the
        clock read it (None: not read, or its time is not valid)."""
        return list(map(self.times.get, positions))

    def _at(self, i: int) -> int | None:
        return self.latest[i - 1] if i else self.base_latest

    def before(self, segment: int, after: int, upto: int, positions: list[int]) -> list[int | None]:
        """The largest time before each of ``positions`` (in ``(after, upto]``; None: no time
        yet), for ``segment`` at ``after``: covered and read under one lock, so no other
        segment's cover or trim comes between."""
        with self.lock:
            self.floors[segment] = after
            self._cover(after, upto)
            if self.coarse:  # the time before each: the largest up to the one before it
                self._refine(after, upto - 1)
            return [self._at(bisect_left(self.positions, p)) for p in positions]

    def _known_to(self, position: int) -> None:
        """Cover up to ``position`` from what is kept (or from a checkpoint), the lock held."""
        self._cover(position if self.base is None else min(position, self.base), position)

    def at(self, position: int) -> int | None:
        """The largest time up to ``position`` (covered here if it is not)."""
        with self.lock:
            self._known_to(position)
            if self.coarse:
                self._refine(position, position)
            return self._at(bisect_right(self.positions, position))

    def reached(self, upto: int, times: list[int]) -> list[int]:
        """For each of ``times`` (reached by ``upto``, a position a segment reached), the
        first position where the clock reached it."""
        with self.lock:
            self._known_to(upto)
            if self.base and self.base_latest is not None and min(times) <= self.base_latest:
                # Below what is kept: a window a write left open though the clock had passed
                # it (a store written before closes came first). The clock is a function of
                # the log: read it from the start, once, to place it exactly.
                log.warning("windows left open below the clock's checkpoint at %d: reading "
                            "the clock from the log's start", self.base)  # fmt: skip
                self.base = None
                self._cover(0, upto)
            found = []
            below = self.base_latest
            for time in times:
                i = bisect_left(self.latest, time)
                if i == len(self.positions) or (below is not None and below >= time):
                    # reached below what is kept, or not at all: a caller's error, never a
                    # guess (a wrong closing position would differ between runs)
                    raise RuntimeError(f"the clock cannot place time {time} above {self.base}")
                found.append(self.positions[i])
            return found

    def trim(self) -> None:
        """Forget what is below every segment's floor: no segment asks there."""
        with self.lock:
            if self.base is None or not self.floors:
                return
            lowest = min(min(self.floors.values()), self.scanned)
            if lowest <= self.base:
                return
            times = self.times
            for position in [p for p in times if p <= lowest]:
                del times[position]
            i = bisect_right(self.positions, lowest)
            if i:
                self.base_latest = self.latest[i - 1]
                del self.positions[:i], self.latest[:i]
            self.base = lowest
            self.coarse = [r for r in self.coarse if r[1] > lowest]
