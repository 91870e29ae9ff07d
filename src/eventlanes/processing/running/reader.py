"""Reading a processor's next batch and sharing it out among the segments it holds."""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import takewhile
from operator import attrgetter
from typing import Any

from ...events import Event, set_source
from ...store import EventStore
from ...tokens import Token
from ...upcasting import Upcasters
from ...windows.ticks import TICK
from ..aggregating.pushdown import build as build_pushdown
from ..aggregating.pushdown.base import Folded, Pending, Pushdown
from ..options import OrderKey
from ..processor import Processor
from ..segment import SegmentState
from ..windowing.pushdown import window_pushdown

log = logging.getLogger("eventlanes.aggregation")

Upto = int | dict[str, int]
#: what a read gives: events, a range folded in SQL (a Folded list), or one to merge in place
Batch = list[Any] | Pending
_POSITION = attrgetter("position")


class BatchReader:
    """The processor's sources (the app's store first, named ""), read from the lowest token
    of the segments asked for."""

    def __init__(
        self,
        proc: Processor,
        sources: list[tuple[str, EventStore]],
        clock_at: Callable[[int], int | None] | None = None,
    ) -> None:
        """``clock_at``: a windowed aggregation's store clock (its largest time up to a
        position), which its ranges folded in SQL start from."""
        self.proc = proc
        self.sources = sources
        self.by_stream = proc.policy.by_stream
        self.routing_hash = proc.policy.routing_hash
        # Only the types some handler takes are read (filtered in SQL); tokens still move past
        # the others, so a processor at the head never looks behind.
        self.types = proc.read_types()
        #: ticks read for the windows' clock (fed the whole batch), shared to no segment
        handled = proc.handled_types()
        self.ticks_only_read = (
            self.types is not None
            and TICK in self.types
            and (handled is None or TICK not in handled)
        )
        #: the upcasters into those types: their old types are read too, and every event is
        #: in its current shape before anything routes or handles it (eventlanes.upcasting)
        self.upcasters = proc.upcasters.into(self.types)
        if self.upcasters is not None:
            self.types = self.upcasters.reads(self.types)
        #: a declarative aggregation folded in SQL where exact (see pushdown.py), its
        #: windows too (windowing/pushdown.py)
        decl, stores = getattr(proc, "declaration", None), [store for _, store in sources]
        enabled, windowing = getattr(proc, "pushdown", False), getattr(proc, "windowing", None)
        self.pushdown: Pushdown | None = (
            build_pushdown(decl, stores, enabled, self.upcasters)
            if windowing is None
            else window_pushdown(
                decl, stores, enabled, windowing, self.types, self.upcasters, clock_at
            )
        )
        #: its ranges may be merged into the stored states in the database (when one segment
        #: covers every key)
        self.in_place = getattr(proc, "merges_in_database", False)

    def read(
        self, states: Sequence[SegmentState], tokens: Sequence[Token] | None = None
    ) -> tuple[Batch, Upto, bool]:
        """The next batch for ``states``: events, how far it is complete, and whether it moves
        any token (a read past events of other segments does). Per-stream routing filters by
        segment in SQL; other policies need the event, so they filter here. ``tokens``: the
        states' tokens to read from, when not their current ones (a read ahead)."""
        proc = self.proc
        segs = [(st.segment.id, st.segment.mask) for st in states] if self.by_stream else None
        held = tokens if tokens is not None else [st.token for st in states]
        if self.pushdown is not None:
            # Folded in SQL (a Folded batch) when every held segment is at the same plain
            # position, so one range is exactly what each of them has not seen.
            first = held[0]
            after = first.position
            if (
                after >= self.pushdown.rows_until
                and (not self.pushdown.whole_only or _whole(states))
                and all(t.is_plain and not t.sources and t.position == after for t in held)
            ):
                folded, upto = self.pushdown.read(after, self, self.in_place and _whole(states))
                if folded is not None:
                    return (folded if folded else []), upto, upto > after
            elif log.isEnabledFor(logging.DEBUG):  # why a pushdown's range is read by rows
                log.debug("read after %d by rows: rows until %d, tokens %s", after,
                          self.pushdown.rows_until, [t.position for t in held])  # fmt: skip
        if len(self.sources) == 1:
            after = min(token.position for token in held)
            # batch_size is per segment transaction (as a tracking reader's): one read for
            # several segments takes as many batches; :meth:`cut` keeps each share to one.
            limit = proc.batch_size * len(states)
            events, upto = self.sources[0][1].read_upto(after, limit, segs, self.types)
            if self.upcasters is not None:
                events = self.upcasters.events(events)
            return events, upto, upto > after
        afters = {
            name: min(token.source(name).position for token in held) for name, _ in self.sources
        }
        events, uptos = read_merged(
            self.sources, afters, proc.batch_size, segs, proc.order, self.types, self.upcasters
        )
        return events, uptos, any(uptos[n] > afters[n] for n in uptos)

    def share(self, states: Sequence[SegmentState], events: Batch) -> dict[SegmentState, Any]:
        """Each event to the held segment that owns it, unless that segment has seen it (a
        range folded in SQL: each key's group)."""
        if isinstance(events, Pending):
            if _whole(states):
                return {states[0]: events}
            # Read for one segment, shared by several (never so far): each folds it by rows.
            unfolded = Folded([], events.after, events.upto, self, exact=False)
            return {st: unfolded for st in states}
        if isinstance(events, Folded) and self.pushdown is not None:
            return self.pushdown.share(events, list(states))
        if self.ticks_only_read:
            events = [e for e in events if e.type != TICK]
        return self._share_events(states, events)

    def _share_events(
        self, states: Sequence[SegmentState], events: list[Event]
    ) -> dict[SegmentState, list[Event]]:
        only = states[0] if len(states) == 1 else None
        if only and only.segment.mask == 0 and only.token.is_plain and not only.token.sources:
            return {only: events}  # the whole hash space, nothing seen ahead: no hashing
        shares: dict[SegmentState, list[Event]] = {st: [] for st in states}
        if len({st.segment.mask for st in states}) == 1 and self._plain(states):
            self._share_plain(states, events, shares)
            return shares
        by_mask: dict[int, dict[int, SegmentState]] = {}
        for st in states:
            by_mask.setdefault(st.segment.mask, {})[st.segment.id] = st
        masks = list(by_mask.items())
        routing_hash = self.routing_hash
        for event in events:
            h = routing_hash(event)
            for mask, ids in masks:
                owner = ids.get(h & mask)
                if owner is not None:
                    if owner.wants(event, h):
                        shares[owner].append(event)
                    break
        return shares

    def cut(
        self, shares: dict[SegmentState, Any], events: Batch, upto: Upto
    ) -> tuple[dict[SegmentState, Any], Upto, tuple[list[Event], Upto] | None]:
        """The shares of a one-source batch cut so none is longer than ``batch_size``: where
        one would be, the batch ends at that share's last event, and so does how far it is
        complete. Returns the shares, how far they are complete, and what was cut off (None
        when nothing was): the events after the cut, exactly the start of the next batch,
        and ``upto``, how far they are complete."""
        size = self.proc.batch_size
        if not isinstance(upto, int) or isinstance(events, Folded | Pending):
            return shares, upto, None  # several sources: cut by the merge; a fold: by range
        over = [evs[size - 1].position for evs in shares.values() if len(evs) > size]
        if not over:
            return shares, upto, None
        end = min(over)
        # Shares and batch are in position order: each is cut at one bisection.
        cut = {st: evs[: bisect_right(evs, end, key=_POSITION)] for st, evs in shares.items()}
        return cut, end, (events[bisect_right(events, end, key=_POSITION) :], upto)

    def rows_between(
        self, st: SegmentState, after: int, upto: int, batch_size: int
    ) -> Iterator[list[Event]]:
        """The events of ``st`` with ``after < position <= upto`` (read again: a range folded
        in SQL that the segment must fold by rows), ``batch_size`` read at a time."""
        store = self.sources[0][1]
        upcast = self.upcasters.events if self.upcasters is not None else list
        batch: list[Event] = []
        for event in store.iter_events(after, batch_size, None, upto, self.types):
            batch.append(event)
            if len(batch) == batch_size:
                if mine := self.share([st], upcast(batch))[st]:
                    yield mine
                batch = []
        if batch and (mine := self.share([st], upcast(batch))[st]):
            yield mine

    def _plain(self, states: Sequence[SegmentState]) -> bool:
        """One source and plain tokens: an event is wanted when it is past the token."""
        return len(self.sources) == 1 and all(
            st.token.is_plain and not st.token.sources for st in states
        )

    def _share_plain(
        self,
        states: Sequence[SegmentState],
        events: list[Event],
        shares: dict[SegmentState, list[Event]],
    ) -> None:
        """:meth:`share` for segments of one mask with plain tokens (the usual case), with
        one dictionary look-up per event."""
        mask = states[0].segment.mask
        table = {st.segment.id: (shares[st], st.token.position) for st in states}
        get = table.get
        if self.by_stream:
            for event in events:
                found = get(event.routing_hash & mask)
                if found is not None and event.position > found[1]:
                    found[0].append(event)
            return
        for event, h in zip(events, self.proc.policy.routing_hashes(events), strict=True):
            found = get(h & mask)
            if found is not None and event.position > found[1]:
                found[0].append(event)


def read_merged(
    sources: list[tuple[str, EventStore]],
    afters: dict[str, int],
    limit: int,
    segments: list[tuple[int, int]] | None,
    order: OrderKey,
    types: frozenset[str] | None = None,
    upcasters: Upcasters | None = None,
) -> tuple[list[Event], dict[str, int]]:
    """A merged batch and, per source, the position it is complete up to; ``upcasters``: the
    events in their current shape before the merge orders them."""
    parts = []
    for name, store in sources:
        events, upto = store.read_upto(afters[name], limit, segments, types)
        if name:
            for event in events:
                set_source(event, name)  # set by the reader, before anyone sees it
        if upcasters is not None:
            events = upcasters.events(events)
        parts.append((name, events, upto, len(events) == limit))
    full = [order(events[-1]) for _, events, _, is_full in parts if is_full]
    cut = min(full) if full else None
    kept_parts = []
    uptos: dict[str, int] = {}
    for name, events, upto, _ in parts:
        kept = events if cut is None else list(takewhile(lambda e: order(e) <= cut, events))
        if len(kept) == len(events):
            uptos[name] = upto
        else:
            uptos[name] = kept[-1].position if kept else afters[name]
        kept_parts.append(kept)
    return list(heapq.merge(*kept_parts, key=order)), uptos


def _whole(states: Sequence[SegmentState]) -> bool:
    """One held segment over every key (a range merged in place is all its own)."""
    return len(states) == 1 and states[0].segment.mask == 0
