"""Window kinds and which windows an event time falls in: ``tumbling(size)``,
``hopping(size, every=)``, ``session(gap=)`` and ``calendar(unit, tz=)``; half-open
``[start, end)`` in integer microseconds, aligned on the epoch (plus an optional ``offset``),
or, for calendar windows, on local midnights of a named time zone.

The one formula, ``start = t - floormod(t - offset, step)``, is written here for Python (whose
``%`` is a floor modulo, right before 1970 too), in :mod:`.sql` for SQLite and PostgreSQL (whose
``%`` truncates toward zero) and in ``spark/windows.py`` for Spark (``pmod``); the tests hold
the three equal over random times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import InvalidInputError
from .durations import micros, shown

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
#: calendar windows' units
CALENDAR_UNITS = ("day", "week", "month")


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


@dataclass(frozen=True)
class Calendar:
    """Back-to-back windows of whole calendar days, weeks (Monday to Monday) or months of a
    named time zone, each from a local midnight to the next: a day is 23 or 25 hours long
    across a daylight-saving change. A midnight that does not exist starts its day where it
    would be on the clock before the change: the day's first instant when the change is at
    midnight (São Paulo until 2019), half an hour in when it skipped from 23:30 (Toronto,
    1919)."""

    unit: str
    tz: str

    def windows(self, t: int) -> list[tuple[int, int]]:
        """The window ``[start, end)`` that holds ``t``."""
        zone = ZoneInfo(self.tz)
        try:
            first = self._first((EPOCH + t * ONE_US).astimezone(zone).date())
            start = self._midnight(first, zone)
            if start > t:  # a local date that comes back after its midnight (clocks set back)
                first = self._first(first - timedelta(days=1))
                start = self._midnight(first, zone)
            after = self._after(first)
            end = self._midnight(after, zone)
            if end <= t:  # the next day's midnight came first (clocks set back across it)
                first, start, after = after, end, self._after(after)
                end = self._midnight(after, zone)
        except (OverflowError, ValueError) as exc:
            raise InvalidInputError(
                f"{self.describe()}: the time {t} (microseconds since the epoch) is outside the "
                "years 1 to 9998 a calendar window can hold"
            ) from exc
        return [(start, end)]

    def _first(self, day: date) -> date:
        """The first day of the window holding local date ``day``."""
        if self.unit == "week":
            return day - timedelta(days=day.weekday())
        return day.replace(day=1) if self.unit == "month" else day

    def _after(self, first: date) -> date:
        """The first day of the next window."""
        if self.unit == "month":
            return date(first.year + first.month // 12, first.month % 12 + 1, 1)
        return first + timedelta(days=7 if self.unit == "week" else 1)

    @staticmethod
    def _midnight(day: date, zone: ZoneInfo) -> int:
        # fold=0: a midnight that does not exist reads on the clock before the change
        local = datetime(day.year, day.month, day.day, tzinfo=zone)
        return (local - EPOCH) // ONE_US

    def describe(self) -> str:
        """What versions compare: a change of window is a new version."""
        return f"calendar({self.unit}, tz={self.tz})"


Window = Tumbling | Hopping | Session | Calendar


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


def calendar(unit: str, tz: str = "UTC") -> Calendar:
    r"""Windows of whole calendar ``unit``\ s (``"day"``, ``"week"`` from Monday, ``"month"``)
    in the IANA time zone ``tz`` (``"Europe/Paris"``): local midnight to local midnight."""
    if unit not in CALENDAR_UNITS:
        raise InvalidInputError(
            f"calendar({unit!r}): the unit must be one of {', '.join(map(repr, CALENDAR_UNITS))}"
        )
    if not isinstance(tz, str) or not tz:
        raise InvalidInputError(f"calendar({unit!r}, tz={tz!r}): tz must name a time zone")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInputError(
            f"calendar({unit!r}, tz={tz!r}): no such time zone (an IANA name such as "
            "'Europe/Paris' or 'UTC')"
        ) from exc
    return Calendar(unit, tz)
