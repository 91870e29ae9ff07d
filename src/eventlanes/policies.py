"""Sequencing policies: which events must be handled in order.

A policy maps an event to a sequence key; events with the same key are handled in store order by
one worker at a time. ``None`` means the event may run in parallel with anything. Keys are routed
to segments with the stable hash, never Python's ``hash()``.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import Any

from .callables import check, name_of
from .errors import InvalidInputError
from .events import Event, datas, types
from .hashing import stable_hash, stable_hashes

KeyFunction = Callable[[Event], Any]


class SequencingPolicy:
    """Wraps a key function; knows how to route an event to a segment by hash."""

    #: True when routing equals the stored ``routing_hash`` (the stream id), so segment
    #: filters can run in SQL.
    by_stream: bool = False

    def __init__(self, key: KeyFunction, name: str, routing: Any = None) -> None:
        self._key = key
        self.name = name
        #: what decides where events go: two policies with equal ``routing`` send every event
        #: to the same segments (the versions of a processor must; ``eventlanes.admin.versions``).
        #: The key function itself unless a built-in policy says what it is.
        self.routing = key if routing is None else routing

    @property
    def key_function(self) -> KeyFunction:
        """The function this policy keys events by (a Spark replay ships its module)."""
        return self._key

    def key(self, event: Event) -> str | None:
        """The event's sequence key (None: it may run in parallel with anything)."""
        value = self._key(event)
        if value is None or value.__class__ is str:
            return value
        return key_text(value, f"sequencing policy {self.name}", event)

    def routing_hash(self, event: Event) -> int:
        """The stable hash segments route the event by: the key's, or the stored stream hash (per
        stream), or the position (no key)."""
        if self.by_stream:
            return event.routing_hash
        key = self.key(event)
        # A key-less event may go anywhere, but always to the same place: route it by its
        # position so every node agrees which segment owns it.
        return stable_hash(f"#{event.position}" if key is None else key)

    def routing_hashes(self, events: list[Event]) -> list[int]:
        """:meth:`routing_hash` of each event (a policy that can, in one pass over the batch)."""
        return list(map(self.routing_hash, events))

    def __repr__(self) -> str:
        return f"<sequencing policy {self.name}>"


class FieldPolicy(SequencingPolicy):
    """Keys from one property of the data of the events ``wanted`` takes (an aggregation's
    ``key="robot"``), routed in one pass over a batch: the data decoded at once and kept for
    the handlers. Routes every event exactly as :meth:`routing_hash` does; an event it cannot
    route so (a key that is not text, data that does not decode) takes that per-event path."""

    def __init__(
        self, key: KeyFunction, name: str, field: str, wanted: Callable[[str], bool]
    ) -> None:
        super().__init__(key, name)
        self.field = field
        self.wanted = wanted

    def routing_hashes(self, events: list[Event]) -> list[int]:
        try:
            rows = datas(events)
        except Exception:  # noqa: BLE001 - a corrupt event: the per-event path routes it
            return super().routing_hashes(events)
        kinds = types(events)
        wanted = {kind: self.wanted(kind) for kind in set(kinds)}
        if all(wanted.values()):
            values = list(map(methodcaller("get", self.field), rows))
            if list(map(type, values)).count(str) == len(values):
                # The usual batch, in C-speed steps: a Python loop of a few calls per event
                # took a fifth of a 4-segment catch-up's time (routing is not needed with one).
                return stable_hashes(values)
        field, one = self.field, self.routing_hash
        hashes = []
        for event, data, kind in zip(events, rows, kinds, strict=True):
            value = data.get(field) if wanted[kind] else None
            if value.__class__ is str:
                hashes.append(stable_hash(value))
            else:  # no key (by position), or one to render: the per-event path
                hashes.append(one(event))
        return hashes


class _PerStream(SequencingPolicy):
    by_stream = True

    def key(self, event: Event) -> str:
        return event.stream_id


def per_stream() -> SequencingPolicy:
    """Events of one stream stay in order (the default)."""
    return _PerStream(lambda e: e.stream_id, "per_stream", "per_stream")


def sequential() -> SequencingPolicy:
    """Every event in store order, one at a time (a single key)."""
    return SequencingPolicy(lambda e: "", "sequential", "sequential")


def full_concurrency() -> SequencingPolicy:
    """No ordering at all: every event may run in parallel with any other."""
    return SequencingPolicy(lambda e: None, "full_concurrency", "full_concurrency")


def by_data(field: str, fallback: str = "stream") -> SequencingPolicy:
    """Order by a property of the event's data (e.g. ``customer_id``).

    Events without the property fall back to per-stream order (``fallback="stream"``), or may
    run in parallel with anything (``fallback="none"``).
    """
    return _by_mapping(field, fallback, lambda e: e.data, "by_data")


def by_metadata(key: str, fallback: str = "stream") -> SequencingPolicy:
    """Order by a metadata key (e.g. ``tenant``); missing keys fall back as in :func:`by_data`."""
    return _by_mapping(key, fallback, lambda e: e.metadata, "by_metadata")


def _by_mapping(
    name: str, fallback: str, mapping: Callable[[Event], dict[str, Any]], kind: str
) -> SequencingPolicy:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} needs a non-empty property name, got {name!r}")
    if fallback not in ("stream", "none"):
        raise ValueError(f"{kind} fallback must be 'stream' or 'none', got {fallback!r}")

    def key(event: Event) -> Any:
        value = mapping(event).get(name)
        if value is None and fallback == "stream":
            return event.stream_id
        return value

    return SequencingPolicy(key, f"{kind}({name!r})", (kind, name, fallback))


def key_text(value: Any, what: str, event: Event) -> str:
    """A sequencing key as text: a string as it is, anything else as ``str()`` renders it (a
    sequencing key only orders events: 5 and "5" in one lane are handled one after the other,
    never merged). An awaitable (a key function that is async, or returns a coroutine) would
    become a different key each time: refused."""
    if isinstance(value, str):
        return value
    _not_awaitable(value, what, event)
    return str(value)


def state_key(value: Any, what: str, event: Event) -> str:
    """The key of a state (aggregations, their stages, declared fields, Spark): a string, as it
    is. Anything else is refused, naming the event and the key's type: no rendering of 5 as
    text can differ from every string key, so 5 and "5" would be folded into one state (or a
    lambda key and ``key="robot"`` render ``True`` differently). A key function that means to
    merge them says so (``str(...)``)."""
    if value.__class__ is str:
        return value
    where = f"{what}: event {event.position} ({event.type})"
    if value is None:  # never folded into a state named "None"
        raise InvalidInputError(f"{where}: the {what.split(' ')[0]} key is None")
    if isinstance(value, str):  # a str subclass (StrEnum...): its text
        return str.__str__(value)
    _not_awaitable(value, what, event)
    raise InvalidInputError(
        f"{where}: the key is {type(value).__name__} {_shown(value)}: a key must be a string "
        '(5 and "5" are never one state: render it as text on purpose, e.g. str(...))'
    )


def key_argument(key: Any, what: str) -> str:
    """``key`` as ``get(key)`` takes it: a string (as :func:`state_key` keys states), else
    InvalidInputError."""
    if key.__class__ is str:
        return key
    if isinstance(key, str):
        return str.__str__(key)
    raise InvalidInputError(
        f"{what}: a key is a string, got {type(key).__name__} {_shown(key)} (states are keyed "
        "by text; a key that was not a string is refused when folded, and one an earlier "
        "release stored as its text reads back by that text)"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _not_awaitable(value: Any, what: str, event: Event) -> None:
    if hasattr(value, "__await__"):
        raise InvalidInputError(
            f"{what}: the key of event {event.position} is {type(value).__name__}, an "
            "awaitable: key functions must return the key itself"
        )


def as_policy(policy: SequencingPolicy | KeyFunction | None, what: str = "") -> SequencingPolicy:
    """Accept a policy, any callable ``event -> key | None``, or None (per stream).
    ``what``: who it is for, in errors (``"processor 'p'"``)."""
    if policy is None:
        return per_stream()
    if isinstance(policy, SequencingPolicy):
        return policy
    if callable(policy):
        role = f"{what}: sequencing policy" if what else "sequencing policy"
        check(policy, role, ("event",), why_sync="the key routes the event before it is read")
        return SequencingPolicy(policy, getattr(policy, "__name__", None) or name_of(policy))
    raise TypeError(f"a sequencing policy must be callable, got {type(policy).__name__}")
