"""Status of processors and waiting for them to catch up."""

from __future__ import annotations

import time
from collections.abc import Iterable

from ..errors import InvalidInputError
from ..processing.processor import Processor
from ..processing.runtime import Runtime
from ..segments import Segment
from ..tokens import Token
from ..tokens.base import resolve_initial
from .dead_letters import events_at
from .views import ProcessorView, SegmentView, segment_view, with_sources


def status(rt: Runtime, proc: Processor) -> ProcessorView:
    """Lags are measured to the committed head: events committed behind an open transaction
    (PostgreSQL) count, and ``read_wait`` says why they are not read yet. A processor with
    other sources counts their events too, each to its own store's committed head."""
    wait = rt.store.read_wait()
    head = wait.committed if wait is not None else rt.store.committed_head()
    rows = rt.tokens.status(proc.name)
    started = bool(rows)
    if started:
        views = [segment_view(head, s) for s in rows]
    else:  # not run yet: what it would start with, without writing anything
        position = resolve_initial(proc.initial, rt.store)
        views = [
            SegmentView(
                seg,
                position,
                max(0, head - position),
                None,
                None,
                position >= head,
                False,
                None,
                0,
                None,
                None,
                Token(position),
            )  # fmt: skip
            for seg in Segment.initial(proc.segments)
        ]
    if proc.sources:
        views = [with_sources(rt, proc, v) for v in views]
    parked = rt.dead_letters.count(proc.name) if proc.on_error == "dead_letter" else 0
    return ProcessorView(
        proc.name,
        head,
        views,
        rt.tokens.live_nodes(proc.name) if started else [],
        parked,
        proc.guarantee.value,
        started,
        rt.tokens.is_paused(proc.name),
        wait,
        proc.segments,
    )


def caught_up(rt: Runtime, proc: Processor, head: int) -> bool:
    """Whether every segment of ``proc`` has reached ``head`` (the store's, read by the
    caller once for several processors) and the head of each other store it reads: for
    callers that poll it, one read of the tokens (and of the other stores' heads)."""
    rows = rt.tokens.status(proc.name)
    # Not run yet: where it would start (other sources start from their beginning).
    start = [] if rows else [Token(resolve_initial(proc.initial, rt.store))]
    tokens = [s.token for s in rows] or start
    heads = {"": head, **{name: rt.source_store(t).head() for name, t in proc.sources.items()}}
    return all(t.source(name).position >= h for t in tokens for name, h in heads.items())


def wait_for(
    rt: Runtime, proc: Processor, positions: int | Iterable[int], timeout: float = 30.0
) -> None:
    """Block until every segment owning the events at ``positions`` has passed them (their
    effects are committed: read-your-writes). Commits of runners in this process wake it at
    once; progress made by other processes is read every 0.25 s."""
    wanted = [positions] if isinstance(positions, int) else list(positions)
    if not wanted or not all(isinstance(p, int) and not isinstance(p, bool) for p in wanted):
        raise InvalidInputError(f"wait_for needs event positions, got {positions!r}")
    committed = rt.store.committed_head()
    missing = [p for p in wanted if p > committed]
    if missing:  # appends return once committed: a position past the committed head is none
        raise InvalidInputError(f"no event at position {missing[0]} in the store")
    # On PostgreSQL a committed event may still lie past the readers' horizon (another append
    # in flight below it): it is read once the horizon passes it, within the timeout.
    unread = sorted(set(wanted))
    targets: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while True:
        seen = rt.progress.generation
        if unread:
            readable = rt.store.head()
            now = [p for p in unread if p <= readable]
            targets += [(e.position, proc.policy.routing_hash(e)) for e in events_at(rt, now)]
            unread = [p for p in unread if p > readable]
        rows = rt.tokens.status(proc.name)
        pending = unread + [
            p
            for p, h in targets
            if not any(r.segment.matches(h) and r.token.covers(p, h) for r in rows)
        ]
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"processor {proc.name!r} has not handled position(s) "
                f"{', '.join(map(str, pending[:10]))} within {timeout:g} s"
            )
        rt.progress.wait(seen, min(left, 0.05 if unread else 0.25))
