"""Handler registration: by event type, for every event, and for resets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, Any], Any]
ResetHandler = Callable[[Any], Any]

_NO_REPLAY = "__eventlanes_disallow_replay__"


def disallow_replay(handler: Handler) -> Handler:
    """Mark a handler that must not run during replays (e-mails and other side effects)."""
    setattr(handler, _NO_REPLAY, True)
    return handler


def runs_on_replay(handler: Handler) -> bool:
    return not getattr(handler, _NO_REPLAY, False)


class HandlerSet:
    """Handlers in registration order; the list for an event type is computed once."""

    def __init__(self) -> None:
        self._entries: list[tuple[frozenset[str] | None, Handler]] = []
        self.batch_handlers: list[tuple[frozenset[str] | None, Handler]] = []
        self.reset_handlers: list[ResetHandler] = []
        self._cache: dict[str, tuple[Handler, ...]] = {}

    def add(self, types: frozenset[str] | None, handler: Handler) -> None:
        if not callable(handler):
            raise TypeError(f"a handler must be callable, got {type(handler).__name__}")
        self._entries.append((types, handler))
        self._cache.clear()

    def for_type(self, event_type: str) -> tuple[Handler, ...]:
        found = self._cache.get(event_type)
        if found is None:
            found = tuple(h for types, h in self._entries if types is None or event_type in types)
            self._cache[event_type] = found
        return found

    def add_batch(self, types: frozenset[str] | None, handler: Handler) -> None:
        if not callable(handler):
            raise TypeError(f"a handler must be callable, got {type(handler).__name__}")
        self.batch_handlers.append((types, handler))

    def __bool__(self) -> bool:
        return bool(self._entries or self.batch_handlers)
