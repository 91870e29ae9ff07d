"""Processors that read several stores, merged into one order by a key (default: the oldest
``recorded_at`` first), with one token per source.

Each round reads a batch from every source. A source whose batch came back full may have more
events older than the others' newest, so the merged batch stops at the smallest "last key" of
the full sources; what lies past that cut is read again next round. Within a source the store
order is kept as it is (the merge only interleaves sources), so per-key order holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import InvalidInputError
from ..events import Event
from ..store import EventStore

OrderKey = Callable[[Event], Any]
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")


def validate_sources(sources: dict[str, Any] | None) -> dict[str, Any]:
    if sources is None:
        return {}
    if not isinstance(sources, dict):
        raise InvalidInputError("sources must be a dict of name -> store URL or EventStore")
    for name, target in sources.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInputError(
                f"invalid source name {name!r}: 1-31 lowercase letters, digits, '_'"
            )
        if not isinstance(target, str | EventStore):
            raise InvalidInputError(f"source {name!r} must be a store URL or an EventStore")
    return dict(sources)


def oldest_first(event: Event) -> tuple[Any, ...]:
    """Default merge order: recorded_at, then source name, then position."""
    recorded = event._recorded_at  # microseconds on both backends, a datetime if converted
    micros = recorded if isinstance(recorded, int) else int(recorded.timestamp() * 1_000_000)
    return (micros, event.source, event.position)
