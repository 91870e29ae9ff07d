"""Upcasters: stored events of an old shape turned into the current one at read time.

``@app.upcaster("OrderPlaced")`` registers ``fn(event) -> data``: events stored as type
``"OrderPlaced"`` (version 1) are read as ``"OrderPlaced.v2"`` with the data ``fn`` returns
(``to=`` names another target: a renamed type). Chains compose (v1 -> v2 -> v3), every
executor applies them before any handler, policy or key function sees the event, and stored
events are never rewritten.

One event in, one event out, with the same position, stream, version, metadata and time: the
position is the event's identity for tokens, replay flags and dead letters, ``(stream_id,
version)`` its idempotency key, and ``(store, "", position)`` (or its metadata's source chain)
its dedupe coordinates. An upcaster that split an event would give two events one identity
(an aggregation would drop the second as not newer; a side effect keyed by the idempotency key
would skip it), one that dropped an event would make what is handled differ between the row
path and the fast paths that count events natively; both are refused. A republisher splits
soundly (its outputs are appended with source chains naming each part); a type nobody
handles is dropped by not handling it. Metadata is read-only for the same reason: it carries
the source chain.

Checked where it is registered (:meth:`Upcasters.add`): the function's signature, a second
upcaster for one stored type, a target that skips a version of its own type, a chain with a
gap (a version of a type that has no upcaster while a newer one exists: its events would
never reach the current shape), a cycle of renames, and a processor that handles a type which
is upcast away (its handler would never run). Checked per event (it cannot be known before):
the result must be a dict that JSON gives back equal, since the Spark executors pass it on as
JSON and the local engine in memory, and both must fold the same values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..callables import check, name_of
from ..errors import InvalidInputError, UpcastError
from ..events import (
    Event,
    NewEvent,
    Undecodable,
    encode_fast,
    encode_object,
    rebuilt,
    type_of,
    types,
)
from .naming import check_type, split_type, type_name

UpcastFunction = Callable[[Event], Any]
#: most upcasters a chain may run through (a guard: chains are checked to end at registration)
_MAX_CHAIN = 10_000


class UpcastFailed(Undecodable):
    """An upcaster's failure, carried as the event's data: accessing it raises
    :class:`~eventlanes.errors.UpcastError` (the event's key fails or parks, not the read)."""

    __slots__ = ()
    error = UpcastError


class _Refused(Exception):
    """Why an upcaster's result is not the event's new data."""


@dataclass(frozen=True)
class Upcaster:
    """``fn`` turns events stored as ``source`` into events of type ``target``."""

    source: str
    target: str
    fn: UpcastFunction

    def __str__(self) -> str:
        return f"upcaster {name_of(self.fn)} ({self.source} -> {self.target})"


class Upcasters:
    """The upcasters of an app, by the stored type each reads."""

    def __init__(self) -> None:
        self._by_source: dict[str, Upcaster] = {}
        self._chains: dict[str, tuple[Upcaster, ...]] = {}
        self._sources: frozenset[str] = frozenset()

    # -- registering ---------------------------------------------------------------------------
    def add(
        self,
        source: str,
        fn: UpcastFunction,
        to: str | None = None,
        handled: Iterable[tuple[str, frozenset[str] | None]] = (),
    ) -> Upcaster:
        """Register ``fn`` for events stored as ``source``, giving type ``to`` (default: the
        next version of ``source``'s type). ``handled``: ``(who, types)`` of the processors
        defined so far, refused if one handles ``source`` (upcast away, its handler would never
        run). Raises :class:`InvalidInputError` saying what is wrong; nothing is registered
        then."""
        check_type(source, "upcaster: the stored type")
        base, version = split_type(source)
        check(fn, f"upcaster of {source!r}", ("event",),
              why_sync="it turns each event as it is read")  # fmt: skip
        _refuse_data_parameter(fn, source)
        target = type_name(base, version + 1) if to is None else check_type(to, "upcaster: to=")
        up = Upcaster(source, target, fn)
        if (existing := self._by_source.get(source)) is not None:
            raise InvalidInputError(
                f"{up}: {existing} is already registered (one upcaster per stored type and "
                "version; a further change of the shape is the next version: register an "
                f"upcaster of {existing.target!r})"
            )
        to_base, to_version = split_type(target)
        if to_base == base and to_version != version + 1:
            raise InvalidInputError(
                f"{up}: an upcaster of {base!r} goes one version up, from {version} to "
                f"{version + 1} ({type_name(base, version + 1)!r}); a later version comes from "
                "the next upcaster of the chain"
            )
        candidate = {**self._by_source, source: up}
        if (cycle := _cycle(candidate, source)) is not None:
            raise InvalidInputError(f"{up} closes a cycle: {' -> '.join(cycle)}")
        if (gap := _gap(candidate)) is not None:
            raise InvalidInputError(f"{up} leaves a gap in a chain: {gap}")
        for who, handles in handled:
            refuse_handled(candidate, handles, who)
        self._by_source = candidate
        self._chains.clear()
        self._sources = frozenset(candidate)
        return up

    def refuse_handled(self, handled: Iterable[str] | None, who: str) -> None:
        """Refuse a processor (``who``) that handles a type these upcasters upcast away."""
        refuse_handled(self._by_source, handled, who)

    # -- reading the registry ------------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self._by_source)

    def __len__(self) -> int:
        return len(self._by_source)

    def __iter__(self) -> Iterator[Upcaster]:
        return iter(self._by_source.values())

    def __repr__(self) -> str:
        return f"<Upcasters {', '.join(str(u) for u in self) or 'none'}>"

    def sources(self) -> frozenset[str]:
        """The stored types that are upcast."""
        return self._sources

    def chain(self, stored: str) -> tuple[Upcaster, ...]:
        """The upcasters an event stored as ``stored`` goes through, in order (none: it is
        read as stored)."""
        found = self._chains.get(stored)
        if found is None:
            steps: list[Upcaster] = []
            up = self._by_source.get(stored)
            while up is not None and len(steps) < _MAX_CHAIN:
                steps.append(up)
                up = self._by_source.get(up.target)
            found = self._chains[stored] = tuple(steps)
        return found

    def current(self, stored: str) -> str:
        """The type an event stored as ``stored`` is read as."""
        steps = self.chain(stored)
        return steps[-1].target if steps else stored

    def into(self, handled: Iterable[str] | None) -> Upcasters | None:
        """The upcasters whose chains end in one of the ``handled`` types (None: every type),
        or None when none does: what a processor reading those types needs (and what a Spark
        job ships)."""
        if not self._by_source:
            return None
        if handled is None:
            return self
        wanted = frozenset(handled)
        kept = {s: u for s, u in self._by_source.items() if self.current(s) in wanted}
        if not kept:
            return None
        if len(kept) == len(self._by_source):
            return self
        sub = Upcasters()
        sub._by_source = kept  # whole chains: every step of one ends where its source does
        sub._sources = frozenset(kept)
        return sub

    def reads(self, handled: frozenset[str] | None) -> frozenset[str] | None:
        """The stored types to read for ``handled`` types: those and the old ones upcast into
        them (None: every type)."""
        if handled is None:
            return None
        return handled | frozenset(s for s in self._sources if self.current(s) in handled)

    def functions(self) -> list[UpcastFunction]:
        """The user's functions (their modules ship to Spark executors)."""
        return [u.fn for u in self]

    # -- upcasting -----------------------------------------------------------------------------
    def events(self, events: Sequence[Event]) -> list[Event]:
        """``events`` with every one of an upcast type replaced by its current shape (the
        others, usually all of them, as they are; one C-level test when none is old). An
        upcaster's failure becomes the event's data (``UpcastFailed``)."""
        if self._sources.isdisjoint(types(events)):
            return events if isinstance(events, list) else list(events)
        sources = self._sources
        return [self.upcast(e) if type_of(e) in sources else e for e in events]

    def upcast(self, event: Event) -> Event:
        """``event`` in its current shape; an upcaster's failure is carried as its data
        (accessing ``data`` raises :class:`~eventlanes.errors.UpcastError` naming the event and
        the upcaster)."""
        steps = self.chain(event.type)
        if not steps:
            return event
        try:
            return self._run(event, steps)
        except _Refused as exc:
            data: Any = UpcastFailed(str(exc))
        return rebuilt(event, steps[-1].target, data)

    def upcast_strict(self, event: Event) -> Event:
        """:meth:`upcast`, raising :class:`~eventlanes.errors.UpcastError` on a failure (bulk
        readers: a Spark job fails naming the event; a fold in Arrow takes the row path)."""
        steps = self.chain(event.type)
        if not steps:
            return event
        try:
            return self._run(event, steps)
        except _Refused as exc:
            raise UpcastError(event.position, str(exc)) from None

    def _run(self, event: Event, steps: tuple[Upcaster, ...]) -> Event:
        current = event
        for up in steps:
            try:
                value = up.fn(current)
            except Exception as exc:  # noqa: BLE001 - reported with the event, not the read
                raise _Refused(f"{up} raised {type(exc).__name__}: {exc}") from exc
            current = rebuilt(current, up.target, _as_data(up, value))
        return rebuilt(current, current.type, _exact(steps[-1], current.data))


def _as_data(up: Upcaster, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if value is None:
        hint = " (a missing return?); an upcaster cannot drop an event: handle nothing for it"
    elif isinstance(value, list | tuple):
        hint = (
            ": an upcaster gives one event for one event (same position and idempotency key); "
            "split events with a republisher"
        )
    elif isinstance(value, NewEvent | Event):
        hint = f": return its data (the type is declared: {up.target!r}, or to=)"
    elif inspect.isawaitable(value):
        hint = ": an awaitable (upcasters are plain functions)"
    else:
        hint = ""
    raise _Refused(f"{up} returned {type(value).__name__}, not the event's new data (a dict){hint}")


def _exact(up: Upcaster, data: dict[str, Any]) -> str:
    """The JSON text of the final data, which must read back equal (the Spark executors pass
    it on as this text; the local engine decodes the same text)."""
    try:
        return encode_fast(data) if data.__class__ is dict else encode_object(data, "data")
    except (TypeError, ValueError, RecursionError):
        try:
            encode_object(data, "data")
        except InvalidInputError as exc:
            raise _Refused(f"{up} returned {exc}") from None
        raise  # pragma: no cover - encode_object refuses what encode_fast refuses


def _cycle(by_source: dict[str, Upcaster], start: str) -> list[str] | None:
    seen = [start]
    up = by_source.get(start)
    while up is not None:
        seen.append(up.target)
        if up.target == start:
            return seen
        if len(seen) > len(by_source) + 1:  # a cycle not through ``start``: refused before
            return seen
        up = by_source.get(up.target)
    return None


def _gap(by_source: dict[str, Upcaster]) -> str | None:
    """Why some event would stop short of its type's current version: per base type, every
    version from the oldest mentioned to the newest but one needs an upcaster."""
    mentioned: dict[str, set[int]] = {}
    upcast: dict[str, set[int]] = {}
    reached_by: dict[tuple[str, int], str] = {}
    for up in by_source.values():
        base, version = split_type(up.source)
        mentioned.setdefault(base, set()).add(version)
        upcast.setdefault(base, set()).add(version)
        to_base, to_version = split_type(up.target)
        mentioned.setdefault(to_base, set()).add(to_version)
        reached_by.setdefault((to_base, to_version), up.source)
    for base, versions in sorted(mentioned.items()):
        newest = max(versions)
        have = upcast.get(base, set())
        for version in range(min(versions), newest):
            if version not in have:
                name = type_name(base, version)
                via = reached_by.get((base, version))
                where = f" (upcast to it from {via!r})" if via is not None else ""
                return (
                    f"{name!r}{where} has no upcaster, but {type_name(base, newest)!r} is a newer "
                    f"version of {base!r}: events of {name!r} would never reach it; register "
                    f"an upcaster for {name!r} first"
                )
    return None


def refuse_handled(by_source: dict[str, Upcaster], handled: Iterable[str] | None, who: str) -> None:
    if handled is None:
        return
    for t in sorted(handled):
        up = by_source.get(t)
        if up is not None:
            current = up.target
            while (nxt := by_source.get(current)) is not None:
                current = nxt.target
            raise InvalidInputError(
                f"{who} handles {t!r}, which {up} turns into {current!r} before any handler "
                f"sees it: its handler would never run; handle {current!r}"
            )


def _refuse_data_parameter(fn: Any, source: str) -> None:
    """``def up(data)`` would get the event, not its data: refused where it is written."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if params and params[0].name in ("data", "d", "payload"):
        raise InvalidInputError(
            f"upcaster of {source!r}: {name_of(fn)}({params[0].name}) is called with the event "
            "(its data is event.data, its metadata event.metadata): name the parameter event"
        )
