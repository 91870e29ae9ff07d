"""Closed windows as records for a sink (``publish=``) and as events for downstream stages:
each window once when it closes, and once more per amendment (``late="amend"``), with a
source chain that a re-publish repeats exactly, so that a consumer's eventlanes aggregation
(or the stage) drops it (as it drops every repeated output).

The chain's root is ``{"source": <aggregation>, "partition": <key>, "offset": <position>,
"out": <i>}``: the position whose clock closed the window (or of the late input that amended
it), and its index among that key's windows published at that position, in time order. Both
come from the log alone, so a run after a crash, a rebuild on a copy of the store, or another
segment count publishes the same window with the same root. One partition per key: a
consumer's key fed by windows of several keys (written by different segments, in any order)
sees each key's roots grow, as its dedupe requires.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ...callables import name_of
from ...errors import InvalidInputError
from ...events import Event, NewEvent
from ...lineage import MAX_NAME, Coordinates
from ...windows.spec import WindowResult, as_datetime
from ..aggregating.aggregation import Stage
from ..tables.windows import Win

#: the ``type`` header of a published window (an eventlanes ingest makes it the event type)
WINDOW_TYPE = "WindowResult"


Closed = list[tuple[int, int, str, int, Win]]


def closed_windows(windows: list[tuple[str, int, Win]]) -> Closed:
    """``(position, out, key, start, window)`` of the closed ones of ``windows`` (open ones
    left out), in position order: the root of each one's chain."""
    done = sorted(
        ((w.closed_at if w.amended_at is None else w.amended_at), key, start, w)
        for key, start, w in windows
        if w.closed_at is not None
    )
    outs: dict[tuple[str, int], int] = {}
    picked = []
    for position, key, start, w in done:
        out = outs[(key, position)] = outs.get((key, position), -1) + 1
        picked.append((position, out, key, start, w))
    return picked


def window_records(name: str, done: Closed) -> list[Any]:
    """``(key, value, chain, headers)`` of the closed windows ``done``, for a sink."""
    headers = [("type", WINDOW_TYPE.encode()), ("aggregation", name.encode())]
    records = []
    for position, out, key, start, w in done:
        value = {
            "key": key, "start": as_datetime(start).isoformat(),
            "end": as_datetime(w.end).isoformat(), "start_us": start, "end_us": w.end,
            "value": w.value, "revision": w.revision, "final": True,
        }  # fmt: skip
        chain = [{"source": name, "partition": partition(key), "offset": position, "out": out}]
        records.append((key, value, chain, headers))
    return records


def stage_outputs(
    name: str, stages: list[Stage], done: Closed
) -> list[tuple[Stage, Coordinates, NewEvent, Event]]:
    """The closed windows ``done`` as outputs for each downstream stage: a ``WindowResult``
    event (the published record's value as its data) from source ``"<name>:<key>"`` at path
    ``(position, out)``, so that a repeat after a crash is dropped by the stage."""
    outputs: list[tuple[Stage, Coordinates, NewEvent, Event]] = []
    for (_, value, chain, _), (position, out, *_) in zip(
        window_records(name, done), done, strict=True
    ):
        source = f"{name}:{chain[0]['partition']}"
        at = Event(position, source, 0, WINDOW_TYPE, {}, {}, 0, 0, source)
        for stage in stages:
            outputs.append((stage, (source, "", (position, out)), NewEvent(WINDOW_TYPE, value), at))
    return outputs


def on_close(
    name: str, closers: list[Callable[[WindowResult], Any]], done: Closed
) -> list[tuple[str, list[NewEvent]]]:
    """The events the ``on_close`` functions return for the closed windows ``done``, by
    stream (``"<name>:<key>"``), in order; a failure names the window."""
    runs: list[tuple[str, list[NewEvent]]] = []
    for _, _, key, start, w in done:
        window = WindowResult(key, start, w.end, w.value, True, w.revision)
        events: list[NewEvent] = []
        for fn in closers:
            try:
                returned = fn(window)
            except Exception as exc:
                raise RuntimeError(
                    f"aggregation {name!r}: on_close {name_of(fn)} failed for the window "
                    f"[{window.start.isoformat()}, {window.end.isoformat()}) of key {key!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if returned is None:
                continue
            if isinstance(returned, NewEvent):
                returned = [returned]
            if not isinstance(returned, list | tuple) or not all(
                isinstance(e, NewEvent) for e in returned
            ):
                raise InvalidInputError(
                    f"aggregation {name!r}: on_close {name_of(fn)} must return NewEvents (a list, "
                    f"one, or None), got {type(returned).__name__}"
                )
            events += returned
        if events:
            runs.append((f"{name}:{partition(key)}", events))
    return runs


def partition(key: str) -> str:
    """The key as the chain's partition: itself, or (past the length a chain's partition may
    have) its SHA-256, still one per key."""
    if len(key) <= MAX_NAME:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
