"""Status of processors and waiting for them to catch up."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from ..errors import InvalidInputError
from ..processing.options import Guarantee
from ..processing.processor import Processor
from ..processing.runtime import Runtime
from ..tokens import Token
from ..tokens.base import resolve_initial
from . import versions
from .dead_letters import events_at
from .views import ProcessorView, measured_head, processor_view, unstarted, with_sources


def status(rt: Runtime, proc: Processor, defined: Iterable[int] = ()) -> ProcessorView:
    """Where ``proc`` is, per segment, and which version of its processor it is: whether it
    serves, how far behind the one that does (``defined``: the versions of its processor the
    app defines; its own counts without being named). Reads only: nothing is created.

    Lags are measured to the committed head: events committed behind an open transaction
    (PostgreSQL) count, and ``read_wait`` says why they are not read yet. A processor with
    other sources counts their events too, each to its own store's committed head."""
    wait = rt.store.read_wait()
    head = measured_head(wait, rt.store.committed_head)
    rows = rt.tokens.status(proc.name)  # a row that cannot be read is marked, not raised
    started = bool(rows)
    if not started:  # not run yet: what it would start with, without writing anything
        rows = unstarted(proc.name, proc.segments, resolve_initial(proc.initial, rt.store))
    aggregation = proc.guarantee is Guarantee.AGGREGATION
    view = processor_view(
        proc.name,
        head,
        rows,
        rt.tokens.live_nodes(proc.name) if started else [],
        rt.dead_letters.count(proc.name) if proc.on_error == "dead_letter" else 0,
        read_wait=wait,
        definition=proc,
        started=started,
        paused=rt.tokens.is_paused(proc.name),
        dropped=rt.states.dropped(proc.name) if aggregation else None,
        dropped_by=rt.states.dropped_by(proc.name) if aggregation else None,
    )
    if proc.sources:
        view = replace(view, segments=[with_sources(rt, proc, v) for v in view.segments])
    spec = getattr(proc, "windowing", None)
    if spec is not None and started:
        summary = rt.windows.summary(proc.name)
        view = replace(view, windows={**summary, "duplicate": view.dropped or 0,
                                      "lateness_us": spec.lateness, "clock": spec.clock,
                                      "idle_close_us": spec.idle_close})  # fmt: skip
    return replace(view, version=versions.view(rt, proc, view, [proc.version, *defined]))


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
