"""What a handler's failure reads as: the errors that carry where it came from, and one-line
descriptions.
"""

from __future__ import annotations

import traceback
from typing import Any

from ...callables import name_of
from ...events import Event


class HandlerFailed(Exception):
    """A per-event handler raised: the event (and its key) are named, for parking."""

    def __init__(self, event: Event, key: str | None, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.event = event
        self.key = key
        self.error = error
        self.text = (
            f"event {event.position} ({event.type}, {event.stream_id} v{event.version}): "
            + "".join(traceback.format_exception_only(type(error), error)).strip()
        )


class BatchHandlerFailed(Exception):
    """An ``on_batch`` handler raised: no single event can be blamed, the batch is retried."""

    def __init__(self, handler: object, error: BaseException) -> None:
        name = getattr(handler, "__name__", repr(handler))
        self.text = (
            f"batch handler {name}: "
            + "".join(traceback.format_exception_only(type(error), error)).strip()
        )
        super().__init__(self.text)


def describe(exc: BaseException) -> str:
    if isinstance(exc, HandlerFailed | BatchHandlerFailed):
        return exc.text
    return f"{type(exc).__name__}: {exc}"


def describe_crash(exc: BaseException) -> str:
    """One line for an exception that stopped a runner, with the notes saying where it came
    from (the handler and event, added by :class:`Dispatch`)."""
    lines = traceback.format_exception_only(type(exc), exc)
    return "; ".join(line.strip() for line in "".join(lines).splitlines() if line.strip())


def note_origin(exc: BaseException, handler: Any, event: Event | None) -> None:
    where = f"raised by handler {name_of(handler)}"
    if event is not None:
        where += f" at event {event.position} ({event.type}, {event.stream_id} v{event.version})"
    exc.add_note(where)
