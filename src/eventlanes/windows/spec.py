"""What a windowed aggregation is asked for (``window=``, ``time=``, ``lateness=``, ...), checked
whole before anything runs, and what it answers with (:class:`WindowResult`,
:class:`LateEvent`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidInputError
from .durations import micros, shown
from .kinds import Hopping, Session, Tumbling
from .time import EPOCH, EventTime, datetime_micros, recorded_time

#: what happens to an input late for a window already closed: kept in the late table and
#: listed (the default), folded into the closed window as a new revision, or counted only
LATE_MODES = ("park", "amend", "count")
#: whose clock decides lateness and closing: the store's (by position: the same for every
#: segment count and engine), or each key's own (for devices that lag by design)
CLOCKS = ("store", "key")
#: closed windows are kept this long (behind the clock) for ``windows()`` and amendments
DEFAULT_RETAIN = "1h"


@dataclass(frozen=True)
class Windowing:
    window: Tumbling | Hopping  # sessions are not in aggregations yet
    time: EventTime
    lateness: int
    max_future: int
    clock: str
    late: str
    retain: int

    def definition(self) -> str:
        """What the folded windows depend on: a change is a new version of the aggregation
        (``retain`` only says how long closed ones are kept, so it is not part of it)."""
        return (
            f"{self.window.describe()}; time={self.time.describe()}; "
            f"lateness={shown(self.lateness)}; max_future={shown(self.max_future)}; "
            f"clock={self.clock}; late={self.late}"
        )


def windowing(
    name: str,
    window: Any,
    time: Any = None,
    lateness: Any = "0s",
    max_future: Any = None,
    clock: str = "store",
    late: str = "park",
    retain: Any = DEFAULT_RETAIN,
) -> Windowing | None:
    """The checked windowing of aggregation ``name`` (None without ``window``; the other
    arguments then refused unless left as they are): InvalidInputError naming what is
    wrong."""
    what = f"aggregation {name!r}"
    if window is None:
        if (
            time is not None
            or max_future is not None
            or (lateness, clock, late, retain) != ("0s", "store", "park", DEFAULT_RETAIN)
        ):
            raise InvalidInputError(
                f"{what}: time, lateness, max_future, clock, late and retain belong to a "
                "windowed aggregation: pass window= too"
            )
        return None
    if isinstance(window, Session):
        raise InvalidInputError(
            f"{what}: session windows are not available in aggregations yet (el.session builds "
            "the kind; use el.tumbling or el.hopping)"
        )
    if not isinstance(window, Tumbling | Hopping):
        raise InvalidInputError(
            f"{what}: window must be el.tumbling(...) or el.hopping(...), got {window!r}"
        )
    time = recorded_time() if time is None else time
    if not isinstance(time, EventTime):
        raise InvalidInputError(
            f"{what}: time must be el.event_time(prop) or el.recorded_time(), got {time!r}"
        )
    late_us = micros(lateness, f"{what}: lateness", zero=True)
    future = late_us if max_future is None else micros(max_future, f"{what}: max_future", True)
    if clock not in CLOCKS:
        raise InvalidInputError(f"{what}: clock must be 'store' or 'key', got {clock!r}")
    if late not in LATE_MODES:
        raise InvalidInputError(
            f"{what}: late must be one of {', '.join(map(repr, LATE_MODES))}, got {late!r}"
        )
    return Windowing(
        window, time, late_us, future, clock, late, micros(retain, f"{what}: retain", True)
    )


def instant(value: Any, what: str) -> int | None:
    """An aware datetime, or microseconds since the epoch, as microseconds (None stays)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, datetime) and value.utcoffset() is not None:
        return datetime_micros(value)
    raise InvalidInputError(
        f"{what}: expected an aware datetime or microseconds since the epoch, got {value!r}"
    )


def as_datetime(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True)
class WindowResult:
    """A window of a key: ``[start, end)`` (``start_us``, ``end_us``: microseconds since the
    epoch), its ``value``, whether it is ``final`` (closed: the clock passed its end plus the
    lateness) and its ``revision`` (late events folded in after it closed, ``late="amend"``)."""

    key: str
    start_us: int
    end_us: int
    value: Any
    final: bool
    revision: int

    @property
    def start(self) -> datetime:
        """The first instant in the window, an aware datetime in UTC."""
        return as_datetime(self.start_us)

    @property
    def end(self) -> datetime:
        """The first instant after the window, an aware datetime in UTC."""
        return as_datetime(self.end_us)


@dataclass(frozen=True)
class LateEvent:
    """An input that came after the clock closed (some of) its windows: its ``position``,
    ``key``, event time ``t_us``, the ``windows`` ``[(start_us, end_us), ...]`` it was late
    for, and whether it was folded into them as a revision (``amended``)."""

    position: int
    key: str
    t_us: int
    windows: list[tuple[int, int]]
    amended: bool
