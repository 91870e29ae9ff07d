"""Durations as whole microseconds: ``"30s"``, ``"1m"``, ``"1h30m"``, ``"250ms"`` or a
``timedelta``. Time in windows is integer microseconds everywhere (``recorded_at`` is, Spark's
TimestampType is), so that Python, SQL and Spark compute the same boundaries exactly."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from ..errors import InvalidInputError

#: microseconds per unit
UNITS = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000,
         "d": 86_400_000_000}  # fmt: skip
_PART = re.compile(r"(\d+)(us|ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:us|ms|s|m|h|d))+")
#: about 292,000 years: a time or duration past it does not fit 64 bits
LIMIT = 2**63 - 1


def micros(value: Any, what: str, zero: bool = False) -> int:
    """``value`` as whole microseconds, or :class:`InvalidInputError` naming ``what``. A bare
    number is refused (its unit would be a guess); so is a negative duration, and zero unless
    ``zero``."""
    if isinstance(value, timedelta):  # whole microseconds: its own resolution
        result = value // timedelta(microseconds=1)
    elif isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        result = sum(int(n) * UNITS[u] for n, u in _PART.findall(value.strip()))
    else:
        shown = repr(value) if not isinstance(value, str) else f"{value!r}"
        raise InvalidInputError(
            f"{what}: expected a duration such as '30s', '1m', '1h30m', '250ms', '1d' or a "
            f"timedelta, got {shown}"
        )
    if result < 0 or (result == 0 and not zero) or result > LIMIT:
        bound = "zero or more" if zero else "more than zero"
        raise InvalidInputError(f"{what}: {value!r} must be {bound} (and under 292,000 years)")
    return result


def shown(us: int) -> str:
    """A duration as the largest units that divide it (``3_600_000_000`` -> ``"1h"``)."""
    if us == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms"):
        if us % UNITS[unit] == 0:
            return f"{us // UNITS[unit]}{unit}"
    return f"{us}us"
