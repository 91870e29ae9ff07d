"""The semantics of windowed counts as a plain loop over the log: what every engine must
produce from the same events, whatever its segments, batches or crashes. Tests hold the
engines to it; it is kept small on purpose, so that it can be read as the specification.

Inputs are ``(position, key, time, recorded)`` in position order (times in microseconds); a
key of None is a tick (:mod:`.ticks`: its time is its ``recorded_at`` less ``tick_lag``), which
moves the store's clock and closes what it passes, and is counted into nothing.
For each input: its time is clamped to ``recorded + max_future``; it is late for each of its
windows that the clock has closed (:mod:`.clock`) and counted into the others; then the clock
advances and every open window it now closes is closed at that position, in (key, start)
order. Sessions: an input whose own ``[t, t + gap)`` overlaps a closed session of its key is
late; else it joins (and may merge) the open sessions of its key it overlaps, and one that
overlaps none is late when its own ``[t, t + gap)`` is closed. A closed session is never
reopened nor overlapped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .clock import Clock, KeyClocks
from .kinds import Session, Window
from .time import clamped


@dataclass
class Result:
    """``counts``: (key, start, end) -> inputs counted, for every window ever opened;
    ``closes``: (position, key, start, end) in the order windows closed; ``late``: (position,
    key, start, end) for each window an input was late for; ``clamped``: positions clamped."""

    counts: dict[tuple[str, int, int], int] = field(default_factory=dict)
    closes: list[tuple[int, str, int, int]] = field(default_factory=list)
    late: list[tuple[int, str, int, int]] = field(default_factory=list)
    clamped: list[int] = field(default_factory=list)


def count_windows(
    inputs: Iterable[tuple[int, str | None, int, int]],
    window: Window,
    lateness: int,
    max_future: int,
    clock: str = "store",
) -> Result:
    result = Result()
    store, keys = Clock(lateness), KeyClocks(lateness)
    open_: dict[str, list[tuple[int, int]]] = {}  # key -> its open windows, in time order
    closed: dict[str, list[tuple[int, int]]] = {}  # key -> its closed windows
    for position, key, time, recorded in inputs:
        t, was = clamped(time, recorded, max_future)
        if was:
            result.clamped.append(position)
        c = store if clock == "store" or key is None else keys.of(key)
        if key is not None:  # an input (a tick only moves the clock)
            mine = open_.setdefault(key, [])
            _count(result, window, c, mine, closed.get(key, []), position, key, t)
        c.advance(t)
        scope = open_ if clock == "store" or key is None else {key: open_[key]}
        for k in sorted(scope):
            for start, end in [w for w in scope[k] if c.closed(w[1])]:
                scope[k].remove((start, end))
                closed.setdefault(k, []).append((start, end))
                result.closes.append((position, k, start, end))
    return result


def _count(
    result: Result, window: Window, c: Clock, mine: list[tuple[int, int]],
    done: list[tuple[int, int]], position: int, key: str, t: int,
) -> None:  # fmt: skip
    """Count the input into its open windows (``mine``: its key's; ``done``: its closed
    ones), or record it late."""
    if isinstance(window, Session):
        before = window.overlapping(mine, t)
        if window.overlapping(done, t) or (not before and c.closed(t + window.gap)):
            # in a session already closed, or alone where one would be
            result.late.append((position, key, t, t + window.gap))
        else:  # joins (and may bridge) open sessions; open ones end past the watermark
            mine[:], joined = window.joined(mine, t)
            count = 1 + sum(result.counts.pop((key, *w)) for w in before)
            result.counts[(key, *joined)] = count
        return
    for start, end in window.windows(t):
        if c.closed(end):
            result.late.append((position, key, start, end))
            continue
        if (start, end) not in mine:
            mine.append((start, end))
            mine.sort()
        result.counts[(key, start, end)] = result.counts.get((key, start, end), 0) + 1
