"""What a windowed aggregation is asked for (``window=``, ``time=``, ``lateness=``, ...), checked
whole before anything runs, and what it answers with (:class:`WindowResult`,
:class:`LateEvent`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidInputError
from .durations import micros, shown
from .kinds import Calendar, Hopping, Session, Tumbling
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
    window: Tumbling | Hopping | Session | Calendar
    time: EventTime
    lateness: int
    max_future: int
    clock: str
    late: str
    retain: int
    #: append a tick once no input nor tick came for this long (None: no ticks are read)
    idle_close: int | None = None
    #: what a tick's time is behind its ``recorded_at`` (devices whose clocks run behind)
    tick_lag: int = 0

    def amendable(self, missed: list[tuple[int, int]], mark: int | None) -> bool:
        """A late input may amend the closed windows it ``missed`` (clock at ``mark``): none is
        past ``retain`` (one that is may already be deleted)."""
        return mark is not None and all(end >= mark - self.retain for _, end in missed)

    def refuse_other(self, name: str, version: int, stored: set[str]) -> None:
        """Refuse to fold windows over the ``stored`` ones of another definition."""
        ran = stored - {self.definition()}
        if ran:
            raise InvalidInputError(
                f"aggregation {name!r} has windows of another definition in the store "
                f"({sorted(ran)[0]}), not {self.definition()}: a changed window, time, "
                f"lateness, clock or late mode is a new version (version={version + 1})"
            )

    def definition(self) -> str:
        """What the folded windows depend on: a change is a new version of the aggregation
        (``retain`` only says how long closed ones are kept, and ``idle_close`` only when
        ticks are appended, so they are not part of it; whether ticks are read is)."""
        ticks = "" if self.idle_close is None else f"; ticks lag={shown(self.tick_lag)}"
        return (
            f"{self.window.describe()}; time={self.time.describe()}; "
            f"lateness={shown(self.lateness)}; max_future={shown(self.max_future)}; "
            f"clock={self.clock}; late={self.late}{ticks}"
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
    idle_close: Any = None,
    tick_lag: Any = "0s",
) -> Windowing | None:
    """The checked windowing of aggregation ``name`` (None without ``window``; the other
    arguments then refused unless left as they are): InvalidInputError naming what is
    wrong."""
    what = f"aggregation {name!r}"
    if window is None:
        if (
            time is not None
            or max_future is not None
            or idle_close is not None
            or (lateness, clock, late, retain, tick_lag)
            != ("0s", "store", "park", DEFAULT_RETAIN, "0s")
        ):
            raise InvalidInputError(
                f"{what}: time, lateness, max_future, clock, late, retain, idle_close and "
                "tick_lag belong to a windowed aggregation: pass window= too"
            )
        return None
    if not isinstance(window, Tumbling | Hopping | Session | Calendar):
        raise InvalidInputError(
            f"{what}: window must be el.tumbling(...), el.hopping(...), el.session(...) or "
            f"el.calendar(...), got {window!r}"
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
    if late == "amend" and isinstance(window, Session):
        raise InvalidInputError(
            f"{what}: late='amend' is not available for session windows (a late input may "
            "bridge closed sessions, already published as final); use 'park' or 'count'"
        )
    idle = None if idle_close is None else micros(idle_close, f"{what}: idle_close")
    lag = micros(tick_lag, f"{what}: tick_lag", zero=True)
    if idle is None and lag:
        raise InvalidInputError(f"{what}: tick_lag says how ticks are read: pass idle_close too")
    if idle is not None and clock == "key":
        raise InvalidInputError(
            f"{what}: ticks move the store's clock; with clock='key' each key's clock moves "
            "only with its own inputs (idle_close is not available there yet)"
        )
    retained = micros(retain, f"{what}: retain", True)
    return Windowing(window, time, late_us, future, clock, late, retained, idle, lag)


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
