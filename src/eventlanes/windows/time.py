"""Event time as integer microseconds since the epoch (UTC): the event's ``recorded_at`` (the
default), or a data property, declared as epoch numbers of one unit (``unit="ms"``) or as
ISO-8601 text with an offset. A naive time (no offset) is refused: its zone would be a guess.

A time is clamped to ``recorded_at + max_future`` (and counted): one future-stamped record
must not move the clock ahead and make honest records late.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from ..errors import EventlanesError, InvalidInputError
from ..events import Event, datas, recorded_raw
from .durations import LIMIT, UNITS

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: units a data property's epoch numbers may be declared in
NUMBER_UNITS = ("s", "ms", "us")


def datetime_micros(value: datetime) -> int:
    """An aware datetime as microseconds since the epoch, exactly."""
    return (value - EPOCH) // _US


@dataclass(frozen=True)
class EventTime:
    """Where an event's time is read: ``prop`` None is ``recorded_at``; else that data
    property, epoch numbers in ``unit`` or (``unit`` None) ISO-8601 text with an offset."""

    prop: str | None = None
    unit: str | None = None

    def of(self, event: Event) -> int:
        """The event's time in microseconds, or :class:`InvalidInputError` naming the event."""
        if self.prop is None:
            raw = recorded_raw(event)
            return raw if isinstance(raw, int) else datetime_micros(raw)
        return self.in_data(event.data, event)

    def times(self, events: Sequence[Event]) -> list[int | None]:
        """Each event's time, None where it has none that is valid (its own segment fails on
        it, naming why): a batch decoded in one pass, whole numbers scaled at C speed."""
        if self.prop is None:
            raws = list(map(recorded_raw, events))
            if list(map(type, raws)).count(int) == len(raws):
                return raws
            return [r if isinstance(r, int) else datetime_micros(r) for r in raws]
        try:
            rows = datas(events)
        except EventlanesError:  # a corrupt one: event by event, that one None
            return [self._or_none(e) for e in events]
        prop = self.prop
        values: list[Any] = [d.get(prop) for d in rows]
        if self.unit is not None and list(map(type, values)).count(int) == len(values):
            scale = UNITS[self.unit]
            scaled: list[int | None] = [v * scale for v in values]
            if not values or (min(values) * scale >= -LIMIT and max(values) * scale <= LIMIT):
                return scaled
        return [self._parsed_or_none(v) for v in values]

    def _or_none(self, event: Event) -> int | None:
        try:
            return self.of(event)
        except EventlanesError:
            return None

    def _parsed_or_none(self, value: Any) -> int | None:
        try:
            return self.parse(value)
        except InvalidInputError:
            return None

    def in_data(self, data: Any, event: Event | None = None) -> int:
        """The time in an event's decoded ``data`` (a data property's time only)."""
        if not isinstance(data, dict) or self.prop not in data:
            raise self._refused(event, "is missing")
        return self.parse(data[self.prop], event)

    def parse(self, value: Any, event: Event | None = None) -> int:
        """``value`` as this property's time in microseconds."""
        if self.unit is None:
            if not isinstance(value, str):
                raise self._refused(
                    event,
                    f"is {value!r}, not ISO-8601 text (numbers need a "
                    "declared unit: event_time(prop, unit='ms'))",
                )
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                raise self._refused(event, f"is {value!r}, not an ISO-8601 time") from None
            if parsed.tzinfo is None or parsed.utcoffset() is None:
                raise self._refused(event, f"is {value!r}, a time with no offset (its zone "
                                           "would be a guess): add Z or +hh:mm")  # fmt: skip
            return datetime_micros(parsed)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._refused(event, f"is {value!r}, not a number of {self.unit}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self._refused(event, f"is {value!r}")
        # The decimal the JSON held (repr round-trips), scaled exactly: 1.000001 s is 1000001 us
        exact = Decimal(repr(value) if isinstance(value, float) else value) * UNITS[self.unit]
        if exact != exact.to_integral_value() or abs(exact) > LIMIT:
            raise self._refused(event, f"is {value!r} {self.unit}: not a whole number of "
                                       "microseconds within 64 bits")  # fmt: skip
        return int(exact)

    def _refused(self, event: Event | None, why: str) -> InvalidInputError:
        where = f"event {event.position} ({event.type}): " if event is not None else ""
        return InvalidInputError(f"{where}time property {self.prop!r} {why}")

    def describe(self) -> str:
        """What versions compare: a change of time is a new version."""
        if self.prop is None:
            return "recorded_at"
        return f"data.{self.prop}" + (f" ({self.unit})" if self.unit else " (ISO-8601)")


def recorded_time() -> EventTime:
    """The event's ``recorded_at``: when the store appended it (the default)."""
    return EventTime()


def event_time(prop: str, unit: str | None = None) -> EventTime:
    """A data property holding the time: ISO-8601 text with an offset, or (``unit``) epoch
    numbers in ``"s"``, ``"ms"`` or ``"us"``."""
    if not isinstance(prop, str) or not prop:
        raise InvalidInputError(f"event_time: a data property name, got {prop!r}")
    if unit is not None and unit not in NUMBER_UNITS:
        raise InvalidInputError(
            f"event_time({prop!r}): unit must be one of "
            f"{', '.join(NUMBER_UNITS)} (or None for ISO-8601), got {unit!r}"
        )
    return EventTime(prop, unit)


def clamped(t: int, recorded: int, max_future: int) -> tuple[int, bool]:
    """``t``, or ``recorded + max_future`` when it is later; and whether it was clamped."""
    bound = recorded + max_future
    return (bound, True) if t > bound else (t, False)
