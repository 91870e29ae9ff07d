"""Reset: the plan, its warnings, and the transaction that rewinds a processor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from ..errors import InvalidInputError
from ..processing.aggregating.aggregation import Aggregation
from ..processing.handlers import runs_on_replay
from ..processing.handling.context import Context
from ..processing.handling.dispatch import Dispatch
from ..processing.options import Guarantee
from ..processing.processor import Processor
from ..processing.republisher import Republisher
from ..processing.runtime import Runtime
from ..segments import Segment
from ..tokens import Token, TokenRecord
from ..tokens.base import resolve_initial
from ..tokens.claims import claim_all, node_name, release_all


def _claim_every_segment(
    rt: Runtime, proc: Processor, owner: str, wait: bool, timeout: float | None
) -> list[TokenRecord]:
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
    if _windowed(proc) and proc.handlers.reset_handlers and (target or any(targets.values())):
        # its on_reset may clear its states (their offsets): the replayed inputs would then
        # be folded into the windows kept a second time
        raise InvalidInputError(
            f"cannot reset {proc.name!r} to position {target:,}: a windowed aggregation with "
            "on_reset handlers is rebuilt from the start: reset it to 'tail' (its windows, "
            "late inputs, clocks and its stages' states are cleared and folded again)"
        )
    return {"": target, **targets}


def _windowed(proc: Processor) -> TypeGuard[Aggregation]:
    return isinstance(proc, Aggregation) and proc.windowing is not None


def _reset_token(
    before: Token, segment: Segment, targets: Mapping[str, int], context: Any
) -> Token:
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
        again = _replayed(rt, store, proc, name, target, after)
        replays += again
        first_time += total - again
    held = [
        f"{s.segment} by {s.owner}"
        for s in rows
        if s.owner is not None and (s.claim_expires_in or 0) > 0
    ]
    handled = any(tok.high > 0 or tok.replays or tok.sources for _, tok in befores)
    return ResetPlan(proc.name, targets[""], replays, first_time, held,
                     _reset_warnings(proc, replays, handled, any(targets.values())))  # fmt: skip


def _replayed(
    rt: Runtime,
    store: Any,
    proc: Processor,
    name: str,
    target: int,
    tokens: list[tuple[Segment, Token]],
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
    upcast = rt.upcasters.upcast  # routed as the reader routes it: current shapes
    count = 0
    for event in store.iter_events(after=target, until=end):
        h = routing_hash(upcast(event))
        for seg, tok in tokens:
            if seg.matches(h):
                count += tok.source(name).is_replay(event.position, h)
                break
    return count


def _reset_warnings(
    proc: Processor, replays: int, handled: bool, midway: bool = False
) -> list[str]:
    """Why a reset of ``proc`` may surprise: what its replayed events do without an
    ``on_reset`` handler to clear what they wrote the first time, or what its ``on_reset``
    handlers clear when nothing is replayed (``handled``: it had passed events before;
    ``midway``: not to the start)."""
    if not replays:
        if handled and proc.handlers.reset_handlers:
            return [
                f"{proc.name!r} replays nothing, but its on_reset handlers run: what they "
                "clear is not built again from the events before the reset position"
            ]
        return []
    if _windowed(proc):  # to the start: rebuilt (rewind clears what it keeps)
        return (
            []
            if not midway
            else [
                f"{proc.name!r} keeps its windows on a reset to another position than the start: "
                f"the {replays:,} replayed event(s) are dropped as duplicates; reset it to 'tail' "
                "to rebuild its windows"
            ]
        )
    if isinstance(proc, Aggregation) and proc.stages and proc.handlers.reset_handlers:
        stages = ", ".join(repr(s.name) for s in proc.stages)
        return [
            f"{proc.name!r} has downstream stages ({stages}) whose states its on_reset "
            "handlers may not clear: outputs of the replayed events are dropped there as "
            "repeats, and the stages keep what the first run gave them; clear them in an "
            "on_reset handler too to rebuild them"
        ]
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
        rewind(rt, proc, owner, records, targets, context)
    finally:
        release_all(rt.tokens, proc.name, owner, records)
    return targets[""]


def rewind(
    rt: Runtime,
    proc: Processor,
    owner: str,
    records: Sequence[TokenRecord],
    targets: Mapping[str, int],
    context: Any = None,
) -> None:
    """The reset transaction (a reset, and a projection's replay on Spark before it runs):
    ``proc``'s ``on_reset`` handlers run, each segment's token goes back to ``targets`` (per
    source, "" the app's own store) with what it had passed flagged as replays, and the
    processor's parked dead letters are dropped (the replay delivers them again), all in one
    transaction. ``owner`` holds every segment's claim (``records``)."""
    db = rt.db
    with db.transaction() as conn:
        ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
        Dispatch(proc.name, proc.handlers, proc.policy).reset(ctx)
        # a windowed aggregation reset to the start is rebuilt
        if _windowed(proc) and not any(targets.values()):
            rt.windows.delete_all(conn, proc.name)
            for name in (proc.name, *(stage.name for stage in proc.stages)):
                rt.states.delete_all(conn, name)
        for record in records:
            token = _reset_token(record.token, record.segment, targets, context)
            rt.tokens.store(proc.name, record.segment.id, token, owner, conn=conn)
        rt.dead_letters.clear(conn, proc.name)
