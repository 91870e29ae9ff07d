"""Window kinds and which windows an event time falls in: ``tumbling(size)``,
``hopping(size, every=)`` and ``session(gap=)``; half-open ``[start, end)`` in integer
microseconds, aligned on the epoch (plus an optional ``offset``).

The one formula, ``start = t - floormod(t - offset, step)``, is written here for Python (whose
``%`` is a floor modulo, right before 1970 too), in :mod:`.sql` for SQLite and PostgreSQL (whose
``%`` truncates toward zero) and in ``spark/windows.py`` for Spark (``pmod``); the tests hold
the three equal over random times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from .durations import micros, shown


def window_start(t: int, step: int, offset: int = 0) -> int:
    """The start of the ``step``-aligned window holding ``t`` (floor modulo: a time before
    1970 is in the window that starts at or before it, never after)."""
    return t - (t - offset) % step


@dataclass(frozen=True)
class Tumbling:
    """Back-to-back windows of ``size`` microseconds: each time is in exactly one."""

    size: int
    offset: int = 0

    @property
    def step(self) -> int:
        return self.size

    def windows(self, t: int) -> list[tuple[int, int]]:
        """The windows ``[start, end)`` that hold ``t``, in time order."""
        start = window_start(t, self.size, self.offset)
        return [(start, start + self.size)]

    def describe(self) -> str:
        """What versions compare: a change of window is a new version."""
        return f"tumbling({shown(self.size)}, offset={shown(self.offset)})"


@dataclass(frozen=True)
class Hopping:
    """Windows of ``size`` microseconds starting every ``every``: a time is in
    ``size / every`` of them (rounded up or down)."""

    size: int
    every: int
    offset: int = 0

    @property
    def step(self) -> int:
        return self.every

    def windows(self, t: int) -> list[tuple[int, int]]:
        """The windows ``[start, end)`` that hold ``t``, in time order."""
        last = window_start(t, self.every, self.offset)
        starts = range(last, t - self.size, -self.every)  # while start + size > t
        return [(s, s + self.size) for s in reversed(starts)]

    def describe(self) -> str:
        """What versions compare: a change of window is a new version."""
        return (
            f"hopping({shown(self.size)}, every={shown(self.every)}, offset={shown(self.offset)})"
        )


@dataclass(frozen=True)
class Session:
    """A key's events less than ``gap`` apart: ``[first, last + gap)``. An event joins every
    session its own ``[t, t + gap)`` overlaps, and bridging two merges them."""

    gap: int

    def overlapping(self, sessions: list[tuple[int, int]], t: int) -> list[tuple[int, int]]:
        """The ``sessions`` an event at ``t`` joins: those its own ``[t, t + gap)`` overlaps."""
        return [(s, e) for s, e in sessions if s < t + self.gap and t < e]

    def joined(
        self, sessions: list[tuple[int, int]], t: int
    ) -> tuple[list[tuple[int, int]], tuple[int, int]]:
        """``sessions`` (disjoint, in time order) after an event at ``t``, and the session that
        now holds it (the sessions it merged are gone from the list)."""
        merged = self.overlapping(sessions, t)
        start = min([t, *(s for s, _ in merged)])
        end = max([t + self.gap, *(e for _, e in merged)])
        kept = sorted([w for w in sessions if w not in merged] + [(start, end)])
        return kept, (start, end)

    def describe(self) -> str:
        """What versions compare: a change of window is a new version."""
        return f"session(gap={shown(self.gap)})"


Window = Tumbling | Hopping | Session


def tumbling(size: Any, offset: Any = "0s") -> Tumbling:
    """Back-to-back windows of ``size`` (``"1m"``, ``timedelta(minutes=1)``), starting at the
    epoch plus ``offset`` (``"15m"``: at a quarter past)."""
    size_us = micros(size, "tumbling(size)")
    return Tumbling(size_us, micros(offset, "tumbling(offset)", zero=True) % size_us)


def hopping(size: Any, every: Any, offset: Any = "0s") -> Hopping:
    """Windows of ``size`` starting ``every`` (``hopping("1h", every="10m")``); ``every`` at
    most ``size`` (longer would leave times in no window)."""
    size_us, every_us = micros(size, "hopping(size)"), micros(every, "hopping(every)")
    if every_us > size_us:
        raise InvalidInputError(
            f"hopping({shown(size_us)}, every={shown(every_us)}): every must not exceed the "
            "size (times between the windows would be in none)"
        )
    return Hopping(size_us, every_us, micros(offset, "hopping(offset)", zero=True) % every_us)


def session(gap: Any) -> Session:
    """A key's events less than ``gap`` apart form one window, ``[first, last + gap)``."""
    return Session(micros(gap, "session(gap)"))
