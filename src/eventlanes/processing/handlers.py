"""Handler registration: by event type, for every event, and for resets. Every function is
checked where it is registered (:func:`eventlanes.callables.check`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..callables import check
from ..errors import InvalidInputError
from ..windows.ticks import TICK

Handler = Callable[[Any, Any], Any]
ResetHandler = Callable[[Any], Any]
Function = Callable[..., Any]  # aggregation folds take (state, event); republishers (event)

_NO_REPLAY = "__eventlanes_disallow_replay__"


def check_types(owner: str, call: str, types: tuple[str, ...], empty: bool = False) -> None:
    """Event type names of ``owner``'s ``call`` (``"on()"``), refused where they are written
    when they could never match a stored type: not text, empty, or holding NUL (which neither
    backend stores; PostgreSQL would refuse it when the runner starts)."""
    if (not types and not empty) or not all(isinstance(t, str) and t for t in types):
        raise InvalidInputError(f"{owner}: {call} needs event type names")
    for t in types:
        if "\x00" in t:
            raise InvalidInputError(
                f"{owner}: {call}: event type {t!r} contains a NUL character, which no stored "
                "type can hold"
            )


def disallow_replay(handler: Handler) -> Handler:
    """Mark a handler that must not run during replays (e-mails and other side effects)."""
    setattr(handler, _NO_REPLAY, True)
    return handler


def runs_on_replay(handler: Handler) -> bool:
    return not getattr(handler, _NO_REPLAY, False)


def takes(types: frozenset[str] | None, event_type: str) -> bool:
    """Whether a handler of ``types`` (None: every type) takes an event of ``event_type``:
    one of every type is never given a tick (:mod:`eventlanes.windows.ticks`)."""
    return event_type in types if types is not None else event_type != TICK


def functions_for(
    by_type: dict[str, list[Function]], every: list[Function], event_type: str
) -> list[Function]:
    """The functions of ``event_type``: its own, then those of every type (never for a
    tick); the local engine's folds and Spark's alike."""
    named = by_type.get(event_type, [])
    return named if event_type == TICK else named + every


def has_functions(
    by_type: dict[str, list[Function]], every: list[Function], event_type: str
) -> bool:
    """Whether :func:`functions_for` finds any (without building the list)."""
    return event_type in by_type or (bool(every) and event_type != TICK)


class HandlerSet:
    """Handlers in registration order; the list for an event type is computed once.

    Handlers may be ``async def`` (or return an awaitable): every executor awaits them where it
    calls them (:mod:`.dispatch`), so exactly-once handlers still write in the batch's
    transaction."""

    def __init__(self, owner: str = "") -> None:
        self.owner = owner
        self._entries: list[tuple[frozenset[str] | None, Handler]] = []
        self.batch_handlers: list[tuple[frozenset[str] | None, Handler]] = []
        self.reset_handlers: list[ResetHandler] = []
        self._cache: dict[str, tuple[Handler, ...]] = {}

    def _check(self, handler: Any, role: str, params: tuple[str, ...]) -> None:
        check(handler, f"processor {self.owner!r}: {role}", params, awaited=True)

    def add(self, types: frozenset[str] | None, handler: Handler) -> None:
        self._check(handler, "handler", ("event", "ctx"))
        self._entries.append((types, handler))
        self._cache.clear()

    def for_type(self, event_type: str) -> tuple[Handler, ...]:
        found = self._cache.get(event_type)
        if found is None:
            found = tuple(h for types, h in self._entries if takes(types, event_type))
            self._cache[event_type] = found
        return found

    def add_batch(self, types: frozenset[str] | None, handler: Handler) -> None:
        self._check(handler, "on_batch handler", ("events", "ctx"))
        self.batch_handlers.append((types, handler))

    def handlers(self) -> list[Handler]:
        """Every per-event and ``on_batch`` handler, in registration order."""
        return [h for _, h in (*self._entries, *self.batch_handlers)]

    def add_reset(self, handler: ResetHandler) -> None:
        self._check(handler, "on_reset handler", ("ctx",))
        self.reset_handlers.append(handler)

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
    """Plain functions by event type (aggregation folds, republisher mappings) of ``owner``
    (``"aggregation 'a'"``), each called with ``params`` (checked at registration);
    ``awaited``: an ``async def`` is run, else it is refused saying ``why_sync``."""

    def __init__(
        self,
        owner: str,
        role: str = "fold",
        params: tuple[str, ...] = ("state", "event"),
        awaited: bool = False,
        why_sync: str = "folds update the state in memory, in the batch's order",
    ) -> None:
        self.owner = owner
        self.role = role
        self.params = params
        self.awaited = awaited
        self.why_sync = why_sync
        self.by_type: dict[str, list[Function]] = {}
        self.any: list[Function] = []

    def check(self, fn: Function) -> None:
        what = f"{self.owner}: {self.role}"
        check(fn, what, self.params, awaited=self.awaited, why_sync=self.why_sync)

    def add_any(self, fn: Function) -> Function:
        self.check(fn)
        self.any.append(fn)
        return fn

    def on(self, *types: str) -> Callable[[Function], Function]:
        check_types(self.owner, "on()", types)

        def register(fn: Function) -> Function:
            self.check(fn)
            for t in types:
                self.by_type.setdefault(t, []).append(fn)
            return fn

        return register

    def for_type(self, event_type: str) -> list[Function]:
        return functions_for(self.by_type, self.any, event_type)

    def handles(self, event_type: str) -> bool:
        return has_functions(self.by_type, self.any, event_type)

    def types(self) -> frozenset[str] | None:
        """The event types with a function; None when one takes every event."""
        if self.any:
            return None
        return frozenset(self.by_type) or None
