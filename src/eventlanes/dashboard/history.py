"""What the dashboard remembers: a short history of its own polls, per processor and ingestor.

Every poll adds one :class:`Sample`: the events handled per second since the previous poll, the
lag in events and in seconds. Samples live in memory only, in a deque of fixed length (the last
``HISTORY_SECONDS`` at the poll interval), so memory stays bounded however long the dashboard
runs; a restarted dashboard starts a new history.

Events handled are counted, not guessed from positions: for each segment, the store's events
between its previous and its current position, times the segment's share of the hash space
(the share of those events that are its own). That is exact while the segments move together
(the usual case: one reader reads for all of them) and a close estimate when they do not. A
segment split since the previous poll counts from its parent's position; after a merge or a
reset the sample has no rate (a gap in the chart). Ingestors count records by offsets.

The ETA is read from the lag's trend over the last ``ETA_WINDOW`` seconds (a least-squares
slope): the lag divided by how fast it falls; "not catching up" when it does not fall.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..segments import Segment

HISTORY_SECONDS = 600.0  # what the charts show at most: the last 10 minutes
ETA_WINDOW = 60.0  # the lag trend the ETA is read from
RATE_WINDOW = 10.0  # the rate shown: the mean of the polls' rates over these seconds

Count = Callable[[int, int], int]
"""(after, upto) -> how many events the store has at positions after < p <= upto."""


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds of the poll
    rate: float | None  # events (records) handled per second since the previous poll
    lag: int | None  # events (records) behind: None when unknown
    lag_seconds: float | None


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 5 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / var


def eta(samples: Iterable[Sample], now: float) -> dict[str, Any]:
    """``state``: caught-up, eta (``seconds``), behind (``growth`` per second) or unknown."""
    recent = [s for s in samples if s.lag is not None and s.at >= now - ETA_WINDOW]
    if not recent:
        return {"state": "unknown", "text": "no data yet"}
    lag = recent[-1].lag
    assert lag is not None
    if lag == 0:
        return {"state": "caught-up", "text": "caught up"}
    if len(recent) < 3:
        return {"state": "unknown", "text": "measuring"}
    change = slope([(s.at, float(s.lag or 0)) for s in recent])
    if change >= 0:
        text = f"falling behind ({change:+,.1f}/s)" if change >= 0.05 else "not catching up"
        return {"state": "behind", "growth": change, "text": text}
    seconds = lag / -change
    return {"state": "eta", "seconds": seconds, "text": f"ETA {duration(seconds)}"}


class Series:
    """One processor's (or ingestor's) samples, oldest first, at most ``maxlen``."""

    def __init__(self, maxlen: int) -> None:
        self.samples: deque[Sample] = deque(maxlen=maxlen)
        self.at: float | None = None
        self.positions: dict[Segment, int] = {}  # a processor's segments at the last poll
        self.offsets = 0  # an ingestor's offsets at the last poll (all partitions)

    def add(self, sample: Sample, positions: dict[Segment, int], offsets: int = 0) -> None:
        self.samples.append(sample)
        self.at, self.positions, self.offsets = sample.at, positions, offsets


def handled_since(
    before: dict[Segment, int], now: dict[Segment, int], count: Count
) -> float | None:
    """Events handled between two polls (see the module's docstring); None after a reset or a
    merge (positions that went back, a segment that came from two)."""
    shares: dict[tuple[int, int], float] = defaultdict(float)
    for seg, position in now.items():
        was = before.get(seg)
        if was is None:  # new since the last poll: a split half counts from its parent's
            parents = [p for s, p in before.items() if s.contains(seg)]
            if not parents:
                return None
            was = parents[0]
        if position < was:
            return None
        if position > was:
            shares[(was, position)] += 1.0 / seg.size
    return sum(share * count(after, upto) for (after, upto), share in shares.items())


class History:
    """Samples of every processor and ingestor; thread-safe (the poller writes, pages read)."""

    def __init__(self, interval: float, seconds: float = HISTORY_SECONDS) -> None:
        self.interval = interval
        self.seconds = seconds
        self.maxlen = math.ceil(seconds / interval) + 1
        self._series: dict[str, Series] = {}
        self._lock = threading.Lock()

    def _series_of(self, key: str) -> Series:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series(self.maxlen)
        return series

    def record(self, status: dict[str, Any], at: float, count: Count) -> None:
        """Add one poll's samples (``status``: the status document of that poll)."""
        with self._lock:
            for p in status["processors"]:
                positions = {Segment(s["id"], s["mask"]): s["position"] for s in p["segments"]}
                series = self._series_of(p["name"])
                rate = None
                if series.at is not None and at > series.at:
                    handled = handled_since(series.positions, positions, count)
                    rate = None if handled is None else handled / (at - series.at)
                series.add(Sample(at, rate, p["lag_events"], p["lag_seconds"]), positions)
            for ing in status.get("ingestors", ()):
                offsets = sum(q["position"] for q in ing["partitions"])
                series = self._series_of(f"ingestor:{ing['name']}")
                rate = None
                if series.at is not None and at > series.at:
                    moved = offsets - series.offsets
                    rate = moved / (at - series.at) if moved >= 0 else None
                series.add(Sample(at, rate, ing["lag_records"], None), {}, offsets)

    def samples(self, key: str) -> list[Sample]:
        with self._lock:
            series = self._series.get(key)
            return list(series.samples) if series is not None else []

    def summary(self, key: str, now: float) -> dict[str, Any]:
        """The latest rate, the ETA and the samples, for the page and ``api/history``."""
        samples = self.samples(key)
        recent = [s.rate for s in samples if s.rate is not None and s.at >= now - RATE_WINDOW]
        rate = sum(recent) / len(recent) if recent else None
        return {"rate": rate, "eta": eta(samples, now), "samples": samples}
