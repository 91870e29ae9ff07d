"""Inspecting and steering processors: status, reset/replay, split/merge/release, dead letters.

Each function takes the runtime and the processor's definition. ``status`` only reads: before a
processor's first run it shows the segments it would start with, and creates nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..errors import InvalidInputError, ProcessorBusyError
from ..events import Event
from ..segments import Segment
from ..store.base import ReadWait, recorded_after
from ..tokens import SegmentStatus, Token
from ..tokens.base import resolve_initial
from ..tracing import spans
from ..versions.view import VersionView
from .claims import claim_all, node_name, release_all
from .context import Context
from .dead_letters import DeadLetter
from .dispatch import Dispatch, describe
from .handlers import runs_on_replay
from .processor import Guarantee, Processor
from .republisher import Republisher
from .runtime import Runtime, layout_note

__all__ = [
    "ProcessorBusyError",
    "ProcessorView",
    "SegmentView",
    "discard_dead_letters",
    "list_dead_letters",
    "ResetPlan",
    "parse_reset_to",
    "reset",
    "reset_plan",
    "retry_dead_letters",
    "status",
    "steer",
]


@dataclass(frozen=True)
class SegmentView:
    segment: Segment
    position: int
    lag: int
    owner: str | None
    claim_age: float | None
    caught_up: bool
    replaying: bool
    last_error: str | None
    errors: int
    retry_in: float | None
    request: str | None
    token: Token
    #: a processor with other sources (``sources=``): when the oldest event it has not
    #: handled in them was recorded (None: none waits); ``lag`` and ``caught_up`` count them
    sources_waiting_since: datetime | None = None


@dataclass(frozen=True)
class ProcessorView:
    name: str
    head: int  # the highest committed position (lags are measured to it)
    segments: list[SegmentView]
    live_nodes: list[str]
    dead_letters: int
    guarantee: str = "exactly-once"
    started: bool = True  # False: never run yet (the segments shown are the ones it would take)
    paused: bool = False
    read_wait: ReadWait | None = None  # why readers stop short of ``head`` (PostgreSQL)
    declared_segments: int | None = None  # the app's segments=, None when read without the app
    #: which version of its processor it is, whether it serves, how far behind (App.status)
    version: VersionView | None = None

    @property
    def readable_head(self) -> int:
        """The highest position readers can read now (below ``head`` while they wait)."""
        return self.read_wait.readable if self.read_wait is not None else self.head

    @property
    def layout_note(self) -> str | None:
        """Why the segments shown are not the declared count (None when they are)."""
        if self.declared_segments is None or not self.started:
            return None
        return layout_note(self.declared_segments, [s.segment for s in self.segments])

    @property
    def position(self) -> int:
        """The lowest position of its segments (where the processor as a whole stands)."""
        return min((s.position for s in self.segments), default=0)

    @property
    def caught_up(self) -> bool:
        """Whether every segment has reached the head."""
        return all(s.caught_up for s in self.segments)

    @property
    def lag(self) -> int:
        """The largest lag of its segments, in events (head minus position)."""
        return max((s.lag for s in self.segments), default=0)


def _segment_view(head: int, s: SegmentStatus) -> SegmentView:
    position = s.token.position
    return SegmentView(
        s.segment,
        position,
        max(0, head - position),
        s.owner,
        s.claim_age,
        position >= head,
        s.token.replaying,
        s.last_error,
        s.errors,
        s.retry_in,
        s.request,
        s.token,
    )


def _with_sources(rt: Runtime, proc: Processor, view: SegmentView) -> SegmentView:
    """``view`` with the events of the other stores the processor reads counted in its lag
    and caught-up (each measured to that store's committed head)."""
    lag, waiting = view.lag, None
    for name, target in proc.sources.items():
        store = rt.source_store(target)
        position, head = view.token.source(name).position, store.committed_head()
        if position < head:
            lag += head - position
            with store.db.guard(f"first event after position {position}"):
                when = recorded_after(store.db, store.events_table, position)
            if when is not None and (waiting is None or when < waiting):
                waiting = when
    if lag == view.lag:
        return view
    return replace(view, lag=lag, caught_up=False, sources_waiting_since=waiting)


def status(rt: Runtime, proc: Processor) -> ProcessorView:
    """Lags are measured to the committed head: events committed behind an open transaction
    (PostgreSQL) count, and ``read_wait`` says why they are not read yet. A processor with
    other sources counts their events too, each to its own store's committed head."""
    wait = rt.store.read_wait()
    head = wait.committed if wait is not None else rt.store.committed_head()
    rows = rt.tokens.status(proc.name)
    started = bool(rows)
    if started:
        views = [_segment_view(head, s) for s in rows]
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
        views = [_with_sources(rt, proc, v) for v in views]
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
            targets += [(e.position, proc.policy.routing_hash(e)) for e in _read_events(rt, now)]
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


def pause(rt: Runtime, proc: Processor) -> bool:
    """Pause ``proc`` everywhere: owners store their tokens and release their segments, and
    nobody claims them until :func:`resume`. True if this call paused it."""
    return rt.tokens.pause(proc.name)


def resume(rt: Runtime, proc: Processor) -> bool:
    return rt.tokens.resume(proc.name)


def _claim_every_segment(
    rt: Runtime, proc: Processor, owner: str, wait: bool, timeout: float | None
) -> list[Any]:
    rt.initialize(*proc.token_spec())
    return claim_all(rt.tokens, proc.name, owner, wait, timeout)


def _reset_targets(rt: Runtime, proc: Processor, to: str | int | datetime) -> dict[str, int]:
    """The position each source restarts from ("" is the app's own store); refused beyond the
    store's head (the events appended there later would never be handled)."""
    target = resolve_initial(to, rt.store)
    head = rt.store.head()
    if target > head:
        raise InvalidInputError(
            f"cannot reset {proc.name!r} to position {target:,}: the store's head is {head:,} "
            "(events appended later up to that position would never be handled)"
        )
    # Other sources restart from the same moment: a position is turned into its time.
    when: Any = to
    if isinstance(to, int) and proc.sources:
        at = rt.store.read(after=max(0, to - 1), limit=1) if to else []
        when = at[0].recorded_at if at else ("tail" if not to else "head")
    targets = {name: resolve_initial(when, rt.source_store(t)) for name, t in proc.sources.items()}
    return {"": target, **targets}


def _reset_token(before: Token, segment: Segment, targets: dict[str, int], context: Any) -> Token:
    """A segment's token after a reset: per source, every event it had passed is a replay
    (per part of the segment, see :meth:`Token.reset`)."""
    token = Token.reset(before, targets[""], context, segment)
    for name, position in targets.items():
        if name:
            token = token.with_source(
                name, Token.reset(before.source(name), position, context, segment)
            )
    return token


def parse_reset_to(value: str, option: str = "--to") -> str | int | datetime:
    """Where a reset restarts, as a user types it (the command line, the dashboard): ``tail``,
    ``head``, a position or an ISO time with a timezone."""
    if value in ("tail", "head"):
        return value
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"invalid {option} {value!r}: use tail, head, a position or an ISO time"
        ) from None
    if when.tzinfo is None:
        raise InvalidInputError(
            f"{option} {value!r} needs a timezone (e.g. 2026-01-01T00:00+00:00)"
        )
    return when


@dataclass(frozen=True)
class ResetPlan:
    """What a reset would do, read without writing (``eventlanes reset`` shows it first)."""

    name: str
    to: int  # the position the app's own store restarts from
    replays: int  # events that will be handled again (flagged replays), in every source
    first_time: int  # events after the restart position never handled before, up to the heads
    held: list[str]  # segments a live node holds: the reset is refused while it runs
    warnings: list[str]

    def summary(self) -> str:
        """What ``eventlanes reset`` and the dashboard say before they ask."""
        if self.replays:
            what = (f"replays {self.replays:,} event(s) handled before (disallow_replay "
                    "handlers skip them)")  # fmt: skip
        else:
            what = f"replays nothing (no event after position {self.to:,} was handled before)"
        return (
            f"{self.name}: the reset {what}; {self.first_time:,} event(s) after position "
            f"{self.to:,} are handled for the first time"
        )


def reset_plan(
    rt: Runtime, proc: Processor, to: str | int | datetime = "tail", context: Any = None
) -> ResetPlan:
    """What :func:`reset` to ``to`` would replay, counted without writing anything."""
    targets = _reset_targets(rt, proc, to)
    rows = rt.tokens.status(proc.name)
    if rows:
        befores = [(s.segment, s.token) for s in rows]
    else:  # never run: the reset creates its rows where a first run would start
        start = Token(resolve_initial(proc.initial, rt.store))
        befores = [(seg, start) for seg in Segment.initial(proc.segments)]
    after = [(seg, _reset_token(tok, seg, targets, context)) for seg, tok in befores]
    replays = first_time = 0
    for name, target in targets.items():
        store = rt.source_store(proc.sources[name]) if name else rt.store
        total = store.count(until=store.head()) - store.count(until=target)
        again = _replayed(store, proc, name, target, after)
        replays += again
        first_time += total - again
    held = [
        f"{s.segment} by {s.owner}"
        for s in rows
        if s.owner is not None and (s.claim_expires_in or 0) > 0
    ]
    handled = any(tok.high > 0 or tok.replays or tok.sources for _, tok in befores)
    return ResetPlan(proc.name, targets[""], replays, first_time, held,
                     _reset_warnings(proc, replays, handled))  # fmt: skip


def _replayed(
    store: Any, proc: Processor, name: str, target: int, tokens: list[tuple[Segment, Token]]
) -> int:
    """How many events of source ``name`` after ``target`` the reset tokens flag as replays."""
    sources = [tok.source(name) for _, tok in tokens]
    ends = {tok.replay_until for tok in sources}
    if ends == {None}:
        return 0
    end = max(e for e in ends if e is not None)
    if not any(tok.replays_by_part for tok in sources) and len(ends) == 1:
        # One end everywhere: a count, no read.
        return store.count(until=end) - store.count(until=target)
    # Ends that differ per segment or part: each event is routed as the processor routes it.
    routing_hash = proc.policy.routing_hash
    upcast = proc.runtime.upcasters.upcast  # routed as the reader routes it: current shapes
    count = 0
    for event in store.iter_events(after=target, until=end):
        h = routing_hash(upcast(event))
        for seg, tok in tokens:
            if seg.matches(h):
                count += tok.source(name).is_replay(event.position, h)
                break
    return count


def _reset_warnings(proc: Processor, replays: int, handled: bool) -> list[str]:
    """Why a reset of ``proc`` may surprise: what its replayed events do without an
    ``on_reset`` handler to clear what they wrote the first time, or what its ``on_reset``
    handlers clear when nothing is replayed (``handled``: it had passed events before)."""
    if not replays:
        if handled and proc.handlers.reset_handlers:
            return [
                f"{proc.name!r} replays nothing, but its on_reset handlers run: what they "
                "clear is not built again from the events before the reset position"
            ]
        return []
    if proc.handlers.reset_handlers:
        return []
    if isinstance(proc, Republisher):
        return [
            f"{proc.name!r} appends its outputs for the {replays:,} replayed event(s) again "
            "(aggregations downstream drop them by their source chain; other readers see them "
            "twice)"
        ]
    if proc.guarantee is Guarantee.AGGREGATION:
        return [
            f"{proc.name!r} has no on_reset handler: its states keep the offsets they folded, so "
            f"the {replays:,} replayed event(s) are dropped as duplicates and the states stay "
            "as they are; to rebuild them, clear them in an on_reset handler"
        ]
    if any(runs_on_replay(h) for h in proc.handlers.handlers()):
        return [
            f"{proc.name!r} has no on_reset handler: what its handlers wrote for the {replays:,} "
            "replayed event(s) is written a second time (rows twice, unless the writes are "
            "idempotent, e.g. upserts)"
        ]
    return []


def reset(
    rt: Runtime,
    proc: Processor,
    to: str | int | datetime = "tail",
    wait: bool = False,
    timeout: float | None = None,
    context: Any = None,
) -> int:
    """Reset a stopped processor to ``to``; returns the position it restarts from.

    Runs the ``on_reset`` handlers and writes replay tokens in one transaction: events up to
    where each segment (each part of a merged segment) had got are replays (``ctx.is_replay``;
    ``disallow_replay`` handlers skip them). Parked dead letters of the processor are dropped:
    the replay delivers them again. A position beyond the store's head is refused: the events
    appended there later would never be handled.
    """
    targets = _reset_targets(rt, proc, to)
    owner = f"reset:{node_name()}"
    records = _claim_every_segment(rt, proc, owner, wait, timeout)
    try:
        db = rt.db
        with db.transaction() as conn:
            ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
            Dispatch(proc.name, proc.handlers, proc.policy).reset(ctx)
            for record in records:
                token = _reset_token(record.token, record.segment, targets, context)
                rt.tokens.store(proc.name, record.segment.id, token, owner, conn=conn)
            rt.dead_letters.clear(conn, proc.name)
    finally:
        release_all(rt.tokens, proc.name, owner, records)
    return targets[""]


def steer(rt: Runtime, proc: Processor, segment_id: int, what: str, timeout: float = 15.0) -> str:
    """Split, merge or release a segment: directly when no live node holds what is needed,
    otherwise by asking the owner through the token store and waiting for it to act."""
    tokens = rt.tokens
    rt.initialize(*proc.token_spec())
    rows = {s.segment.id: s for s in tokens.status(proc.name)}
    if segment_id not in rows:
        raise InvalidInputError(f"processor {proc.name!r} has no segment {segment_id}")
    before = {s.segment for s in rows.values()}
    segment = rows[segment_id].segment
    owner = f"cli:{node_name()}"
    if what == "release":
        if rows[segment_id].owner is None:
            return f"{segment} is not claimed"
        tokens.request(proc.name, segment_id, "release")
        holder = rows[segment_id].owner
        return _await(
            rt, proc, timeout,
            lambda st: st[segment_id].owner is None or st[segment_id].owner != holder,
            f"released {segment}",
        )  # fmt: skip
    needed = [segment_id]
    if what == "merge":
        if segment.mask == 0:
            raise InvalidInputError(f"segment {segment} is the root: nothing to merge")
        sibling = segment.sibling()
        row = rows.get(sibling.id)
        if row is None or row.segment != sibling:
            raise InvalidInputError(
                f"cannot merge {segment}: its sibling {sibling} is split further (merge those "
                "first)"
            )
        needed.append(sibling.id)
    got = []
    for seg_id in needed:
        if seg_id in rows and tokens.claim(proc.name, seg_id, owner, ignore_pause=True):
            got.append(seg_id)
    try:
        if len(got) == len(needed):
            if what == "split":
                a, b = tokens.split(proc.name, segment_id, owner)
                return f"split {segment} into {a} and {b}"
            merged = tokens.merge(proc.name, segment_id, owner)
            return f"merged {segment} and {segment.sibling()} into {merged}"
    finally:
        for seg_id in got:
            if seg_id in {s.segment.id for s in tokens.status(proc.name)}:
                tokens.release(proc.name, seg_id, owner)
    # A live node holds it: ask the owner.
    target = needed[0] if rows[needed[0]].owner else needed[-1]
    tokens.request(proc.name, segment_id if what == "split" else target, what)
    return _await(
        rt,
        proc,
        timeout,
        lambda st: {s.segment for s in st.values()} != before,
        f"{what} of {segment} done by its owner",
    )


def _await(
    rt: Runtime,
    proc: Processor,
    timeout: float,
    done: Callable[[dict[int, SegmentStatus]], bool],
    message: str,
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {s.segment.id: s for s in rt.tokens.status(proc.name)}
        if done(rows):
            return message
        refused = [s.request_refused for s in rows.values() if s.request_refused]
        if refused:
            raise InvalidInputError(f"the owner of {proc.name!r} refused: {refused[0]}")
        time.sleep(0.2)
    raise ProcessorBusyError(
        f"asked the owner of processor {proc.name!r}; it did not act within {timeout:.0f} s "
        "(the request stays pending until it does)"
    )


def list_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> list[DeadLetter]:
    """Parked events of ``proc`` (of one key, or one position), in position order."""
    return rt.dead_letters.list(proc.name, key=key, position=position)


def _read_events(rt: Runtime, positions: list[int]) -> list[Event]:
    """The events at ``positions``, in their current shapes (as the handlers saw them)."""
    found = []
    for position in positions:
        events = rt.store.read(after=position - 1, limit=1) if position >= 1 else []
        if not events or events[0].position != position:
            raise InvalidInputError(f"no event at position {position} in the store")
        found.append(events[0])
    return rt.upcasters.events(found)


def retry_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> tuple[int, int]:
    """Re-run parked events (all, one key's, or one position's), in order per key, each key in
    one transaction with the deletion of its dead letters. Per-event and ``on_batch`` handlers
    run as in the live processor. Returns (events handled, events of the selection still
    parked). Retrying one position of a key with earlier parked events is refused: it would
    overtake them."""
    letters = list_dead_letters(rt, proc, key, position)
    if position is not None and letters and letters[0].seq_key is not None:
        # Retrying a later event of a key before its earlier parked ones breaks per-key order.
        first = list_dead_letters(rt, proc, letters[0].seq_key)[0]
        if first.position < position:
            raise InvalidInputError(
                f"dead letter at position {position} waits behind position {first.position} "
                f"of the same key {first.seq_key!r}: retry that one first, or the whole key"
            )
    groups: dict[str, list[DeadLetter]] = {}
    for letter in letters:  # ordered by position
        groups.setdefault(letter.seq_key or f"#{letter.position}", []).append(letter)
    handled = 0
    db = rt.db
    dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
    tracer = spans.tracer()
    for key, group in groups.items():
        events = _read_events(rt, [d.position for d in group])
        with ExitStack() as traced:
            if tracer is not None:  # a span per key, child of the caller's, linked to appends
                base = spans.base_attributes(proc.name, None, proc.guarantee.value,
                                             getattr(proc, "version", None))  # fmt: skip
                extra = {spans.KEY: key} if group[0].seq_key is not None else None
                traced.enter_context(spans.batch(tracer, "retry", base, events, root=False,
                                                 extra=extra))  # fmt: skip
            try:
                with db.transaction() as conn:
                    ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
                    dispatch.run(events, ctx, False)
                    rt.dead_letters.delete(conn, proc.name, [e.position for e in events])
                handled += len(events)
            except Exception as exc:  # noqa: BLE001 - recorded on the dead letter, key stays
                failed = getattr(exc, "event", None) or events[0]
                rt.dead_letters.record_failure(proc.name, failed.position, describe(exc))
                spans.failed(exc, describe(exc))
    return handled, len(letters) - handled


def discard_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> int:
    letters = list_dead_letters(rt, proc, key, position)
    with rt.db.transaction() as conn:
        rt.dead_letters.delete(conn, proc.name, [d.position for d in letters])
    return len(letters)
