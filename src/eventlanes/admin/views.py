"""Read models of processors, segments and versions, as status shows them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..errors import CorruptTokenError
from ..names import versioned_name
from ..processing.processor import Processor
from ..processing.runtime import Runtime, layout_note
from ..segments import Segment
from ..store.base import ReadWait, recorded_after
from ..tokens import SegmentStatus, Token
from ..tokens.base import RETIRED, VersionRecord


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
    #: why its token row could not be read (its position is the stored column's; the rest of
    #: the token is unknown): shown as a problem, never as a healthy segment
    corrupt: str | None = None


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
    #: retired for good (its one marker row left): shown as such, with no segments
    retired: bool = False
    #: inputs an aggregation dropped as duplicates, over its keys (None: not an aggregation)
    dropped: int | None = None
    #: of ``dropped``, how many by root source (drops counted before schema version 4 have
    #: none: the sum may be less than ``dropped``)
    dropped_by: Mapping[str, int] | None = None
    #: a windowed aggregation's counts, clock and open windows (None: not windowed; see
    #: ``status-json.md``)
    windows: Mapping[str, Any] | None = None

    @property
    def readable_head(self) -> int:
        """The highest position readers can read now (below ``head`` while they wait)."""
        return self.read_wait.readable if self.read_wait is not None else self.head

    @property
    def layout_note(self) -> str | None:
        """Why the segments shown are not the declared count (None when they are)."""
        if self.declared_segments is None or not self.started or self.retired:
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


def measured_head(wait: ReadWait | None, committed_head: Callable[[], int]) -> int:
    """The head lags are measured to: the committed one (``wait`` knows it when readers wait
    behind an open transaction; otherwise ``committed_head`` reads it)."""
    return wait.committed if wait is not None else committed_head()


def unreadable(exc: BaseException | None) -> str | None:
    """What status says of a token row that cannot be read (None: it can)."""
    if exc is None:
        return None
    why = exc.reason if isinstance(exc, CorruptTokenError) else f"{type(exc).__name__}: {exc}"
    return f"corrupt token row: {why}"


def segment_view(head: int, s: SegmentStatus, corrupt: str | None = None) -> SegmentView:
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
        None,
        corrupt,
    )


def unstarted(name: str, segments: int, position: int) -> list[SegmentStatus]:
    """The segments a processor that never ran would start with, at ``position`` (nothing is
    written: status shows them until a node creates its token rows)."""
    return [SegmentStatus(name, seg, Token(position), None, None, None, None, None, 0.0)
            for seg in Segment.initial(segments)]  # fmt: skip


def processor_view(
    name: str,
    head: int,
    rows: Sequence[SegmentStatus],
    live_nodes: list[str],
    dead_letters: int,
    *,
    read_wait: ReadWait | None = None,
    version: VersionView | None = None,
    definition: Processor | None = None,
    started: bool = True,
    paused: bool = False,
    corrupt: Mapping[int, str] | None = None,
    dropped: int | None = None,
    dropped_by: Mapping[str, int] | None = None,
) -> ProcessorView:
    """The one builder of a :class:`ProcessorView`, from what the caller could read: the
    app's status (``definition``: the processor as defined, for its guarantee and declared
    segments) or a store's tables alone (the read-only inspector: no definition).
    ``corrupt``: segment id -> why its token row could not be read. A retired processor's
    marker row is no segment: it is shown retired, with none."""
    retired = bool(rows) and all(s.owner == RETIRED for s in rows)
    bad = corrupt or {}
    segments = [] if retired else [
        segment_view(head, s, bad.get(s.segment.id) or unreadable(s.corrupt))
        for s in rows]  # fmt: skip
    if definition is None:
        return ProcessorView(name, head, segments, live_nodes, dead_letters, started=started,
                             paused=paused, read_wait=read_wait, version=version,
                             retired=retired, dropped=dropped,
                             dropped_by=dropped_by)  # fmt: skip
    return ProcessorView(
        name,
        head,
        segments,
        live_nodes,
        dead_letters,
        definition.guarantee.value,
        started,
        paused,
        read_wait,
        definition.segments,
        version,
        retired,
        dropped,
        dropped_by,
    )


def with_sources(rt: Runtime, proc: Processor, view: SegmentView) -> SegmentView:
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


@dataclass(frozen=True)
class VersionView:
    """One version of a processor as ``status`` shows it."""

    base: str  # the processor's name as defined (``orders``)
    version: int
    serving: bool  # readers see this version (``app.table``, ``app.serving``)
    serving_version: int | None  # the version readers see (None: none has run yet)
    behind: int | None  # serving version's position minus this one's (None: this one serves)
    started_at: float | None = None  # epoch seconds its first node created its tokens
    promoted_at: float | None = None  # epoch seconds it was last promoted
    retired: bool = False


def serving_version(
    records: Iterable[VersionRecord], first_ran: Callable[[], bool], defined: Iterable[int] = ()
) -> int | None:
    """The version readers see: the last one promoted (and not retired); before any promotion,
    the lowest version that has run and was not retired (version 1 has no row of its own
    before it is promoted: ``first_ran`` says whether its token rows exist, not retired; it is
    asked only when no promotion decides); before anything ran, the lowest version defined
    (None when none is)."""
    records = list(records)
    promoted = [r for r in records if r.promoted_at is not None and r.retired_at is None]
    if promoted:
        last = max(promoted, key=lambda r: (r.promoted_at, r.version))
        return last.version
    if first_ran():  # the lowest version there is
        return 1
    ran = [r.version for r in records if r.started_at is not None and r.retired_at is None]
    if ran:
        return min(ran)
    known = sorted(defined)
    return known[0] if known else None


def version_view(
    base: str,
    version: int,
    serving: int | None,
    position: int,
    lowest_position: Callable[[str], int | None],
    record: VersionRecord | None = None,
) -> VersionView:
    """What status says of ``version`` of ``base`` (at ``position``, its lowest segment's),
    when ``serving`` serves: how far behind that one it is (``lowest_position`` of a stored
    processor name; None: it has no token rows), and ``record``'s times."""
    behind = None
    if serving is not None and serving != version:
        at = lowest_position(versioned_name(base, serving))
        behind = None if at is None else max(0, at - position)
    return VersionView(
        base,
        version,
        serving == version,
        serving,
        behind,
        record.started_at if record else None,
        record.promoted_at if record else None,
        record is not None and record.retired_at is not None,
    )
