"""The one place that calls a processor's handlers for a batch of events.

Every executor uses it: the pooled and tracking runners, parallel lanes, dead-letter retry and
the Spark replay of projections. It runs, in this order, the per-event handlers of each event
(skipping ``disallow_replay`` handlers for replayed events), parking an event instead when its
key has an earlier failure (dead-letter mode), and then the ``on_batch`` handlers with the
events they asked for. Reset handlers run through :meth:`Dispatch.reset`.

A handler that is an ``async def`` (or returns any awaitable) is awaited where it is called,
before the next handler or event: one at a time, in order, on the calling thread, so its
``ctx.execute`` writes are in the batch's transaction like a plain handler's. The event loop
is made at the batch's first awaitable and closed with the batch (:class:`Awaiter`), as the
lanes' loop is: objects bound to a loop must not be kept across batches.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ...callables import name_of
from ...events import Event
from ...policies import SequencingPolicy
from ...tokens import Token
from ...tracing import spans
from ..handlers import Handler, HandlerSet, runs_on_replay, takes
from .failures import BatchHandlerFailed, HandlerFailed, note_origin

WAITING = "waiting behind an earlier failed event of the same key"


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def never_ran(value: Any, handler: Any) -> None:
    """Refuse a generator returned by a handler: none of its body ran (a ``yield`` in it?)."""
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        raise TypeError(
            f"handler {name_of(handler)} returned a {type(value).__name__}: its body never "
            "ran (a `yield` in it?); handlers return None or an awaitable"
        )


class Awaiter:
    """Runs the awaitables handlers return, on an event loop of this thread made at the first
    one and closed by :meth:`close` (the end of the batch)."""

    __slots__ = ("_runner",)

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None

    def result(self, value: Any, handler: Any) -> Any:
        """``value`` as a handler returned it, awaited if it is awaitable. A generator (a
        handler with ``yield``) ran none of its body: refused rather than dropped."""
        if inspect.isawaitable(value):
            if self._runner is None:
                self._runner = asyncio.Runner()
            coro: Coroutine[Any, Any, Any] = (
                value if inspect.iscoroutine(value) else _awaited(value)
            )
            return self._runner.run(coro)
        never_ran(value, handler)
        return value

    def close(self) -> None:
        runner = self._runner
        if runner is not None:
            self._runner = None
            runner.close()


def is_replay(token: Token, event: Event, policy: SequencingPolicy) -> bool:
    """Whether ``event`` was handled before the last reset, by the replay end of its part of
    the segment (routed by ``policy``, as the reader routes it)."""
    return replay_test(token, policy)(event)


def replay_test(token: Token, policy: SequencingPolicy) -> Callable[[Event], bool]:
    """:func:`is_replay` for the events of one batch read with ``token``, worked out once:
    a position compare where one end serves the whole segment, the event routed only where
    the ends differ per part."""
    if not token.sources:
        return _replay_test(token, policy)
    tests = {"": _replay_test(token, policy)}
    tests.update((name, _replay_test(t, policy)) for name, t in token.sources)
    return lambda event: tests.get(event.source, _never)(event)


def _never(event: Event) -> bool:
    return False


def _replay_test(token: Token, policy: SequencingPolicy) -> Callable[[Event], bool]:
    if not token.replays:
        return _never
    if not token.replays_by_part:
        until = token.replay_until
        assert until is not None
        return lambda event: event.position <= until
    routing_hash = policy.routing_hash
    return lambda event: token.is_replay(event.position, routing_hash(event))


def never_replay(token: Token | bool) -> bool:
    """True when no event handled from ``token`` can be a replay (no reset is being replayed,
    in any source): the common case, where per-event replay checks can be skipped."""
    if isinstance(token, bool):
        return not token
    return not token.replays and all(not t.replays for _, t in token.sources)


class Parking:
    """Dead-letter parking for one segment batch: keys already parked in the table, and the
    failures of this batch's earlier attempts (each attempt is rolled back as a whole)."""

    def __init__(self, parked: set[str]) -> None:
        self.parked = parked
        self.keys: dict[str, int] = {}  # key -> position of its first failed event
        self.events: dict[int, str] = {}  # position -> why it failed

    def failed(self, exc: HandlerFailed) -> None:
        self.events[exc.event.position] = exc.text
        if exc.key is not None:
            self.keys.setdefault(exc.key, exc.event.position)

    @property
    def active(self) -> bool:
        return bool(self.parked or self.keys or self.events)

    def reason(self, event: Event, key: str | None) -> str | None:
        """Why ``event`` is parked instead of handled, or None to handle it."""
        reason = self.events.get(event.position)
        if (
            reason is None
            and key is not None
            and (key in self.parked or self.keys.get(key, event.position + 1) < event.position)
        ):
            reason = WAITING
        return reason


#: parks ``(event, key, reason, replay)``
Park = Callable[[Event, "str | None", str, bool], None]
Watch = Callable[[Any], None]  # told each event (or batch handler) before its handlers run


class Dispatch:
    """A processor's handlers, called the same way by every executor."""

    def __init__(self, name: str, handlers: HandlerSet, policy: SequencingPolicy) -> None:
        self.name = name
        self.handlers = handlers
        self.policy = policy

    def replayed(self, token: Token, event: Event) -> bool:
        """Whether ``event`` is a replay by ``token`` (see :func:`is_replay`)."""
        return is_replay(token, event, self.policy)

    def for_event(self, event: Event, replay: bool) -> Sequence[Handler]:
        """The per-event handlers to call for ``event``."""
        found = self.handlers.for_type(event.type)
        if replay:
            return [h for h in found if runs_on_replay(h)]
        return found

    def run(
        self,
        events: Sequence[Event],
        ctx: Any,
        token: Token | bool,
        parking: Parking | None = None,
        park: Park | None = None,
        watch: Watch | None = None,
    ) -> list[Event]:
        """Handle ``events`` in order; returns those handled (not parked). ``token``: the
        segment's token when the batch started, which says which events are replays, or
        True / False when all are (a bulk replay) or none are (a first delivery).
        Raises :class:`HandlerFailed` or :class:`BatchHandlerFailed`; the caller rolls back."""
        check = parking is not None and parking.active
        live = never_replay(token)
        if not check and not self.handlers.has_event_handlers:
            handled = list(events)  # on_batch handlers only: nothing to do per event
            self.run_batch(handled, ctx, token, watch, live)
            return handled
        awaiter = Awaiter()
        try:
            return self._run(events, ctx, token, parking, park, watch, check, live, awaiter)
        finally:
            awaiter.close()

    def _run(
        self,
        events: Sequence[Event],
        ctx: Any,
        token: Token | bool,
        parking: Parking | None,
        park: Park | None,
        watch: Watch | None,
        check: bool,
        live: bool,
        awaiter: Awaiter,
    ) -> list[Event]:
        key_of = self.policy.key
        for_type = self.handlers.for_type
        result = awaiter.result
        replayed = (lambda e: token) if isinstance(token, bool) else replay_test(token, self.policy)
        traced = spans.current()  # a recording batch span: one child span per handler call
        handled = []
        for event in events:
            if check:
                assert parking is not None and park is not None
                key = key_of(event)
                reason = parking.reason(event, key)
                if reason is not None:
                    park(event, key, reason, not live and replayed(event))
                    continue
            if live:
                replay = False
                handlers: Sequence[Handler] = for_type(event.type)
            else:
                replay = replayed(event)
                handlers = self.for_event(event, replay)
            ctx.is_replay = replay
            if watch is not None:
                watch(event)
            for handler in handlers:
                try:
                    if traced is not None:
                        with traced.handler(event, handler, replay):
                            if (returned := handler(event, ctx)) is not None:
                                result(returned, handler)
                    elif (returned := handler(event, ctx)) is not None:
                        result(returned, handler)
                except Exception as exc:  # noqa: BLE001 - reported with the event
                    raise HandlerFailed(event, key_of(event), exc) from exc
                except BaseException as exc:  # stops the runner: say where it came from
                    note_origin(exc, handler, event)
                    raise
            handled.append(event)
        self.run_batch(handled, ctx, token, watch, live, awaiter)
        return handled

    def run_batch(
        self,
        handled: Sequence[Event],
        ctx: Any,
        token: Token | bool,
        watch: Watch | None = None,
        live: bool | None = None,
        awaiter: Awaiter | None = None,
    ) -> None:
        """The ``on_batch`` handlers, each with the handled events of its types. ``live``:
        known that none of them is a replay (:func:`never_replay`); ``awaiter``: the batch's
        (else one of its own)."""
        if not self.handlers.batch_handlers:
            return
        if awaiter is None:
            own = Awaiter()
            try:
                return self.run_batch(handled, ctx, token, watch, live, own)
            finally:
                own.close()
        if live is None:
            live = never_replay(token)
        replayed = (lambda e: token) if isinstance(token, bool) else replay_test(token, self.policy)
        traced = spans.current()
        for types, handler in self.handlers.batch_handlers:
            if live:
                chosen = [e for e in handled if takes(types, e.type)]
            else:
                replay_ok = runs_on_replay(handler)
                chosen = [
                    e for e in handled if takes(types, e.type) and (replay_ok or not replayed(e))
                ]
            if not chosen:
                continue
            ctx.is_replay = False if live else all(replayed(e) for e in chosen)
            if watch is not None:
                watch(handler)
            try:
                if traced is not None:
                    with traced.batch_handler(handler, chosen):
                        if (returned := handler(chosen, ctx)) is not None:
                            awaiter.result(returned, handler)
                elif (returned := handler(chosen, ctx)) is not None:
                    awaiter.result(returned, handler)
            except Exception as exc:  # noqa: BLE001
                raise BatchHandlerFailed(handler, exc) from exc
            except BaseException as exc:
                note_origin(exc, handler, None)
                raise

    def reset(self, ctx: Any) -> None:
        """The ``on_reset`` handlers, in the reset's (or replay's) transaction."""
        awaiter = Awaiter()
        try:
            for handler in self.handlers.reset_handlers:
                if (returned := handler(ctx)) is not None:
                    awaiter.result(returned, handler)
        finally:
            awaiter.close()
