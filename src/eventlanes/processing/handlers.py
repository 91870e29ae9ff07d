"""Handler registration: by event type, for every event, and for resets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidInputError

Handler = Callable[[Any, Any], Any]
ResetHandler = Callable[[Any], Any]
Function = Callable[..., Any]  # aggregation folds take (state, event); republishers (event)

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

    def handlers(self) -> list[Handler]:
        """Every per-event and ``on_batch`` handler, in registration order."""
        return [h for _, h in (*self._entries, *self.batch_handlers)]

    def __bool__(self) -> bool:
        return bool(self._entries or self.batch_handlers)

    @property
    def has_event_handlers(self) -> bool:
        """Whether any per-event handler is registered (``on_batch`` handlers aside)."""
        return bool(self._entries)

    def types(self) -> frozenset[str] | None:
        """The event types some handler takes; None when one takes every event."""
        named: set[str] = set()
        for types, _ in (*self._entries, *self.batch_handlers):
            if types is None:
                return None
            named |= types
        return frozenset(named) or None


class FunctionsByType:
    """Plain functions by event type (aggregation fns, republisher mappings)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.by_type: dict[str, list[Function]] = {}
        self.any: list[Function] = []

    def on(self, *types: str) -> Callable[[Function], Function]:
        if not types or not all(isinstance(t, str) and t for t in types):
            raise InvalidInputError(f"{self.owner!r}: on() needs event type names")

        def register(fn: Function) -> Function:
            for t in types:
                self.by_type.setdefault(t, []).append(fn)
            return fn

        return register

    def for_type(self, event_type: str) -> list[Function]:
        return self.by_type.get(event_type, []) + self.any

    def handles(self, event_type: str) -> bool:
        return bool(self.any) or event_type in self.by_type

    def types(self) -> frozenset[str] | None:
        """The event types with a function; None when one takes every event."""
        if self.any:
            return None
        return frozenset(self.by_type) or None
