"""How an input joins a key's session windows, one rule for both engines (the local
executor, :mod:`eventlanes.spark.window_fold`): what :meth:`eventlanes.windows.kinds.Session.joined`
says of the bounds, with the states merged by the aggregation's ``on_merge``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...callables import name_of
from ...errors import InvalidInputError
from ...windows.kinds import Session
from ..tables.windows import Win


def merge_of(agg: Any) -> Callable[[Any, Any], Any] | None:
    """How two sessions of an aggregation an input bridges merge their states (its
    declaration's, or its ``on_merge``); refused for session windows without one."""
    merge = agg.declaration.merge if agg.declaration is not None else agg.merger
    if agg.windowing is not None and isinstance(agg.windowing.window, Session) and merge is None:
        raise InvalidInputError(
            f"aggregation {agg.name!r} has session windows: an input that bridges two "
            "sessions of a key merges their states; give a merge function "
            "(@agg.on_merge: fn(into, other))"
        )
    return merge


def join_session(
    name: str,
    key: str,
    merge: Callable[[Any, Any], Any],
    mine: dict[int, Win],
    joined: list[tuple[int, Win]],
    t: int,
    gap: int,
    initial: Callable[[], Any],
) -> tuple[int, Win]:
    """The session of ``key`` (its windows ``mine``, by start) that now holds an input at
    ``t``, and its start: a new one, or the ``joined`` ones (in time order) merged into the
    first, spanning them and ``t``. The starts it merged away are gone from ``mine``."""
    end = t + gap
    if not joined:
        start, w = t, Win(end, initial())
    else:
        start, w = min(t, joined[0][0]), joined[0][1]
        for _, other in joined[1:]:
            merged = merge(w.value, other.value)
            if merged is not None and merged is not w.value:  # dropped: refused, not lost
                raise InvalidInputError(
                    f"aggregation {name!r}, key {key!r}: on_merge {name_of(merge)} returned "
                    f"{type(merged).__name__}: it merges other into into in place (returns "
                    "None or into), it does not return a new state"
                )
            end = max(end, other.end)
        for s, _ in joined:
            del mine[s]
        end = max(end, w.end)
    w.end = end
    mine[start] = w
    return start, w
