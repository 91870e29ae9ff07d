"""Processor health: the status as a versioned JSON document and the rules that call it healthy.

Used by ``eventlanes status --json`` (health checks, scripts), the dashboard and the metrics
collector. Lag is given twice: in events (head - position) and in seconds (how long the first
event after the segment's token, the one it reads next, has been waiting), both measured to the
committed head: on PostgreSQL events committed behind a still open appending transaction count,
and ``read_wait`` names that transaction. A processor is unhealthy when a segment has an error,
a dead letter is parked, its lag exceeds a limit, or readers have waited behind one
transaction for ``READ_WAIT_WARNING`` seconds.

:class:`~eventlanes.admin.inspect.ReadOnlyInspector` builds the same views (with the same
builder, :func:`~eventlanes.admin.views.processor_view`) from a store URL alone (no app module):
it reads the token, node, dead-letter and event tables with plain SELECTs and never writes (it
refuses a store that does not exist instead of creating it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidInputError
from ..names import split_version
from ..store.base import READ_WAIT_WARNING, recorded_after
from ..tokens.base import RETIRED_NOTE
from ..windows.durations import shown
from ..windows.spec import as_datetime
from .views import ProcessorView, SegmentView

SCHEMA = "eventlanes.status/1"
"""Version of the JSON document; a new field keeps it, a changed or removed one bumps it."""

FirstAfter = Callable[[int], datetime | None]
"""position -> ``recorded_at`` of the first event after it (None when there is none)."""


@dataclass(frozen=True)
class MaxLag:
    events: int | None = None
    seconds: float | None = None


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_max_lag(text: str) -> MaxLag:
    """``1000`` (events) or ``30s`` / ``500ms`` / ``5m`` / ``1h`` (seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if match is None:
        raise InvalidInputError(
            f"invalid --max-lag {text!r}: use a number of events (1000) or a duration "
            "(30s, 500ms, 5m, 1h)"
        )
    number, unit = match.groups()
    if unit is None:
        if "." in number:
            raise InvalidInputError(f"invalid --max-lag {text!r}: events are a whole number")
        return MaxLag(events=int(number))
    return MaxLag(seconds=float(number) * _UNITS[unit])


def lag_seconds(first_after: FirstAfter, position: int, head: int, now: datetime) -> float:
    """Age of the oldest unhandled event: 0 when caught up."""
    if position >= head:
        return 0.0
    when = first_after(position)
    return 0.0 if when is None else max(0.0, (now - when).total_seconds())


def segment_lag_seconds(first_after: FirstAfter, s: SegmentView, head: int, now: datetime) -> float:
    """A segment's :func:`lag_seconds`, or the age of the oldest event it has not handled in
    another store it reads (``sources=``) when that is older."""
    own = lag_seconds(first_after, s.position, head, now)
    other = s.sources_waiting_since
    return own if other is None else max(own, (now - other).total_seconds())


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def segment_document(s: SegmentView, lag_s: float) -> dict[str, Any]:
    return {
        "segment": str(s.segment),
        "id": s.segment.id,
        "mask": s.segment.mask,
        "position": s.position,
        "lag_events": s.lag,
        "lag_seconds": _round(lag_s),
        "caught_up": s.caught_up,
        "owner": s.owner,
        "claim_age_seconds": _round(s.claim_age),
        "replaying": s.replaying,
        "replay_until": s.token.replay_until,
        "errors": s.errors,
        "last_error": s.last_error,
        "retry_in_seconds": _round(s.retry_in),
        "request": s.request,
        "corrupt": s.corrupt,
    }


def processor_document(
    view: ProcessorView, first_after: FirstAfter, max_lag: MaxLag, now: datetime | None = None
) -> dict[str, Any]:
    """One processor's entry of the status document, with its problems (empty: healthy)."""
    now = now or datetime.now(UTC)
    segments = [segment_document(s, segment_lag_seconds(first_after, s, view.head, now))
                for s in view.segments]  # fmt: skip
    problems = []
    for s in segments:
        if s["corrupt"]:  # its token unknown: never shown as a healthy segment
            problems.append(f"segment {s['segment']}: {s['corrupt']}")
        if s["errors"] or s["last_error"]:
            problems.append(
                f"segment {s['segment']}: {s['errors']} failed attempt(s): {s['last_error']}"
            )
    if view.dead_letters:
        problems.append(f"{view.dead_letters} dead letter(s) parked")
    lag_events = max((s["lag_events"] for s in segments), default=0)
    lag_s = max((s["lag_seconds"] for s in segments), default=0.0)
    if max_lag.events is not None and lag_events > max_lag.events:
        problems.append(f"lag {lag_events} events > --max-lag {max_lag.events}")
    if max_lag.seconds is not None and lag_s > max_lag.seconds:
        problems.append(f"lag {lag_s:.1f} s > --max-lag {max_lag.seconds:g} s")
    notes: list[str] = []
    wait = view.read_wait
    if wait is not None:
        (problems if wait.age >= READ_WAIT_WARNING else notes).append(wait.describe())
    if view.layout_note is not None:
        notes.append(f"this app {view.layout_note}")
    if view.retired:
        notes.append(RETIRED_NOTE)
    if view.paused:  # on purpose, so not a problem: but nothing runs it, and its lag grows
        notes.append(f"paused: no node claims its segments (eventlanes resume ... {view.name})")
    if view.dropped:
        sources = dropped_sources(view.dropped, view.dropped_by)
        notes.append(f"{view.dropped:,} duplicate(s) dropped (inputs already folded in, by "
                     f"their source chain): {sources}")  # fmt: skip
    if view.windows is not None:
        notes += window_notes(view.windows, view.caught_up)
    return {
        "name": view.name,
        "healthy": not problems,
        "problems": problems,
        "head": view.head,
        "position": view.position,
        "lag_events": lag_events,
        "lag_seconds": lag_s,
        "caught_up": view.caught_up,
        "live_nodes": view.live_nodes,
        "dead_letters": view.dead_letters,
        "readable_head": view.readable_head,
        "read_wait": wait.document() if wait is not None else None,
        "declared_segments": view.declared_segments,
        "notes": notes,
        "retired": view.retired,
        "paused": view.paused,
        "dropped_duplicates": view.dropped,
        "dropped_duplicates_by_source": (
            None if view.dropped_by is None else dict(view.dropped_by)
        ),
        "windows": None if view.windows is None else dict(view.windows),
        **version_fields(view),
        "segments": segments,
    }


def window_notes(windows: Mapping[str, Any], caught_up: bool) -> list[str]:
    """A windowed aggregation's counts (every input read is folded, late or a duplicate),
    and, caught up with windows open, that they wait for time: no clock moves without
    inputs, so a window closes only when a later one comes."""
    w = windows
    notes = [f"windows: {w['folded']:,} input(s) folded, {w['late']:,} late, "
             f"{w['duplicate']:,} duplicate(s), {w['clamped']:,} clamped"]  # fmt: skip
    if caught_up and w["open"] and w["oldest_end_us"] is not None:
        oldest = as_datetime(w["oldest_end_us"]).isoformat()
        needed = as_datetime(w["oldest_end_us"] + w["lateness_us"]).isoformat()
        clock = "no time yet" if w["clock_us"] is None else as_datetime(w["clock_us"]).isoformat()
        idle = w.get("idle_close_us")
        what, ticks = (
            ("an input", "no ticks: idle_close is not set") if idle is None
            else ("an input or a tick", f"a tick is appended after {shown(idle)} with no input")
        )  # fmt: skip
        if w.get("clock") == "key":  # each key's own clock: only its inputs move it
            what, ticks = "an input of its own key", "each key has a clock of its own"
        at = "" if w.get("clock") == "key" else f"the clock is at {clock}; "
        notes.append(
            f"waiting for time: {w['open']:,} window(s) open, the oldest ending {oldest}; it "
            f"closes when {what} with a time at or after {needed} comes ({at}{ticks})"
        )
    return notes


def dropped_sources(total: int, by: Mapping[str, int] | None) -> str:
    """``3 of orders, 1 of el_events`` (the most first), and those counted before drops had
    a source (schema version 4)."""
    by = by or {}
    parts = [f"{n:,} of {source}" for source, n in sorted(by.items(), key=lambda i: (-i[1], i[0]))]
    unknown = total - sum(by.values())
    if unknown > 0:
        parts.append(f"{unknown:,} counted before drops had a source")
    return ", ".join(parts)


def version_fields(view: ProcessorView) -> dict[str, Any]:
    """``base`` and ``version`` (``orders@v2``: "orders", 2), ``serving`` (readers see this
    version) and ``behind_events`` (the serving version's position minus this one's; null for
    the serving version itself)."""
    ver = view.version
    if ver is None:  # a view built without version information: the name tells the version
        base, version = split_version(view.name)
        return {"base": base, "version": version, "serving": version == 1, "behind_events": None}
    return {"base": ver.base, "version": ver.version, "serving": ver.serving,
            "behind_events": ver.behind}  # fmt: skip


def status_document(
    processors: list[dict[str, Any]],
    max_lag: MaxLag,
    ingestors: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole document: healthy when every processor and Kafka ingestor is (ingestors, a
    list of their own, only when there are some)."""
    document = {
        "schema": SCHEMA,
        "generated_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "healthy": all(p["healthy"] for p in [*processors, *(ingestors or ())]),
        "max_lag": {"events": max_lag.events, "seconds": max_lag.seconds},
        "processors": processors,
    }
    if ingestors:
        document["ingestors"] = ingestors
    return document


def store_first_after(store: Any) -> FirstAfter:
    """``first_after`` of an open :class:`~eventlanes.store.EventStore`: committed events past
    the readers' horizon count (as in ``status --url``)."""

    def first_after(position: int) -> datetime | None:
        with store.db.guard(f"first event after position {position}"):
            return recorded_after(store.db, store.events_table, position)

    return first_after
