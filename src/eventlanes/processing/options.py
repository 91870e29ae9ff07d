"""The processor options, written once: what the App's factories take (typed dicts, so editors
and mypy know each option through ``**options``) and what a definition holds once they are
checked (:class:`RunOptions`).

Two of them concern processors that read several stores (``sources``), merged into one order by
a key (``order``; default: the oldest ``recorded_at`` first) with one token per source; the
merge itself is ``read_merged`` in ``processing/running/reader.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict

from ..callables import check
from ..errors import InvalidInputError
from ..events import Event, recorded_raw
from ..names import check_table_name, validate_version
from ..policies import KeyFunction, SequencingPolicy, as_policy
from ..segments import Segment
from ..store import EventStore
from ..tokens.base import Initial, check_seconds

OrderKey = Callable[[Event], Any]
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")

MODES = ("pooled", "tracking")
ERROR_MODES = ("retry", "dead_letter")
#: an aggregation's states cached per worker process (see :class:`AggregationOptions`): about
#: 65,000 small states, and peak memory flat at about 100 MB of growth from 400,000 keys to
#: 4,000,000 on SQLite, under the 120 MB aimed at (256 MiB: 240 MB; benchmarks/bench_memory.py)
STATE_CACHE_BYTES = 64 * 2**20


class Guarantee(StrEnum):
    """What a processor promises about its effects; shown by ``status``."""

    #: handlers' writes (``ctx.execute``) and the token commit in one transaction
    EXACTLY_ONCE = "exactly-once"
    #: handlers run outside the token's transaction (lanes, side effects); after a crash the
    #: events past the stored token run again, so effects must be idempotent
    AT_LEAST_ONCE = "at-least-once"
    #: folds deduplicated by source offsets, states written with the token (aggregations)
    AGGREGATION = "aggregation"


class AggregationOptions(TypedDict, total=False):
    """The options every kind of processor takes (``app.aggregation(..., **options)`` takes
    these; :class:`RepublisherOptions` and :class:`ProcessorOptions` add theirs). Each is
    checked where the processor is defined."""

    #: the parts its events are split into, each handled in order (split and merged later by
    #: ``balance``); default 1
    segments: int
    #: events per segment transaction at most (an aggregation: the events read at a time by
    #: rows; its states are written every ``persist_every`` seconds whatever it is); default 500
    batch_size: int
    #: ``"pooled"`` (one reader per process, the default) or ``"tracking"`` (one reader per
    #: segment)
    mode: str
    #: at most this many segments per process (default: no limit)
    max_segments: int | None
    #: the pooled mode's handler threads (default: one per segment; an aggregation's, one:
    #: folds compute in Python, where more threads only queue for its interpreter lock)
    workers: int | None
    #: ``"retry"`` the batch (the default) or ``"dead_letter"`` the failed event and the later
    #: ones of its key (exactly-once processors)
    on_error: str
    #: other stores it also reads, ``{name: URL or store}`` (default: none)
    sources: dict[str, Any] | None
    #: ``event -> key`` merging the sources (default: oldest first)
    order: OrderKey | None
    #: handler calls in flight per segment (``app.processor(..., guarantee="at-least-once")``);
    #: default 1
    lanes: int
    #: seconds a handler call may take; default 30
    handler_timeout: float
    #: events in flight in a segment's lanes (at-least-once processors); default 1000
    lane_window: int | None
    #: PostgreSQL pipeline mode for the batches of exactly-once processors; default False
    pipeline: bool
    #: ``version=N``: a new version of the processor, beside the earlier ones, with tokens and
    #: tables of its own (``eventlanes.admin.versions``); default 1
    version: int
    #: the tables its handlers build (``ctx.table`` names): what ``app.table(name)`` looks up
    #: and what retiring a version drops
    tables: list[str] | tuple[str, ...]
    #: an aggregation's states kept in memory by each worker process, in bytes (estimated from
    #: their JSON), shared by the segments it holds; past it, states written and unchanged
    #: since are dropped (read back when needed), and changed ones are written early; default
    #: 64 MiB (``STATE_CACHE_BYTES``). Aggregations only.
    state_cache_bytes: int


class RepublisherOptions(AggregationOptions, total=False):
    """What ``app.republisher(..., **options)`` takes: :class:`AggregationOptions` and these
    two (an aggregation routes by its key and starts at the first event)."""

    #: what is kept in order, an ``el.per_stream()``-like policy or ``event -> key`` (default:
    #: per stream)
    policy: SequencingPolicy | KeyFunction | None
    #: where a new processor starts: ``"tail"`` (the first event, the default), ``"head"``, a
    #: position or a time
    initial: Initial


class ProcessorOptions(RepublisherOptions, total=False):
    """What ``app.processor(..., **options)`` and ``app.publisher`` take: every option,
    :class:`AggregationOptions` and :class:`RepublisherOptions`'s, and the guarantee (a
    republisher's is at-least-once, an aggregation's its own)."""

    #: ``"exactly-once"`` (the default: handlers' writes commit with the token) or
    #: ``"at-least-once"`` (handlers outside the transaction, e.g. ``lanes=K`` of async I/O)
    guarantee: str


def refuse_unknown(what: str, options: Mapping[str, object], allowed: type) -> None:
    """A TypeError for an option ``allowed`` (a TypedDict above) does not list, as Python
    gives for a misspelled keyword: ``**options`` would otherwise take anything."""
    for key in options:
        if key not in allowed.__annotations__:  # a TypedDict's: its keys and its bases'
            raise TypeError(f"{what} got an unexpected keyword argument {key!r}")


@dataclass(frozen=True)
class RunOptions:
    """The options of :class:`ProcessorOptions`, checked: each value of its own type, the
    defaults filled in (``policy``, ``order`` and ``lane_window`` too)."""

    version: int
    tables: tuple[str, ...]
    guarantee: Guarantee
    segments: int
    policy: SequencingPolicy
    batch_size: int
    mode: str
    max_segments: int | None
    workers: int | None
    on_error: str
    initial: Initial
    sources: dict[str, Any]
    order: OrderKey
    lanes: int
    handler_timeout: float
    lane_window: int
    pipeline: bool
    state_cache_bytes: int

    @classmethod
    def check(cls, name: str, kind: str, options: ProcessorOptions) -> RunOptions:
        """``options`` of processor ``name`` checked in the order they are listed; ``kind``
        (``"processor"``, ``"aggregation"``, ``"republisher"``) names it in messages, and lanes,
        lane windows and pipelines are for plain processors only (elsewhere they would be
        ignored: refused instead). Raises InvalidInputError naming the first wrong value."""
        refuse_unknown(f"{kind} {name!r}", options, ProcessorOptions)
        what = f"processor {name!r}"
        version = validate_version(options.get("version", 1), name)
        tables = _tables(name, options.get("tables", ()))
        guarantee = _guarantee(name, options.get("guarantee", "exactly-once"))
        if guarantee is Guarantee.AGGREGATION and kind == "processor":
            raise InvalidInputError(f"{what}: guarantee 'aggregation' is for app.aggregation(...)")
        segments = options.get("segments", 1)
        try:
            Segment.initial(segments)
        except ValueError as exc:
            raise InvalidInputError(f"{what}: {exc}") from None
        policy = as_policy(options.get("policy"), what)
        batch_size = options.get("batch_size", 500)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f"{what}: batch_size must be >= 1, got {batch_size!r}")
        mode = options.get("mode", "pooled")
        if mode not in MODES:
            raise InvalidInputError(f"{what}: mode must be one of {MODES}, got {mode!r}")
        max_segments = options.get("max_segments")
        if max_segments is not None and not _count(max_segments):
            raise InvalidInputError(f"{what}: max_segments must be >= 1, got {max_segments!r}")
        workers = options.get("workers")
        if workers is not None and not _count(workers):
            raise InvalidInputError(f"{what}: workers must be >= 1, got {workers!r}")
        on_error = options.get("on_error", "retry")
        if on_error not in ERROR_MODES:
            raise InvalidInputError(
                f"{what}: on_error must be one of {ERROR_MODES}, got {on_error!r}"
            )
        sources = validate_sources(options.get("sources"))
        order = options.get("order")
        if order is not None:
            check(order, f"{what}: order=", ("event",),
                  why_sync="the merge compares the keys at once")  # fmt: skip
        _refuse_ignored(what, mode, workers, on_error, sources, order)
        lanes, handler_timeout, lane_window, pipeline = _lanes(name, kind, guarantee, options)
        state_cache_bytes = _state_cache_bytes(name, kind, options)
        return cls(
            version=version, tables=tables, guarantee=guarantee, segments=segments,
            policy=policy, batch_size=batch_size, mode=mode, max_segments=max_segments,
            workers=workers, on_error=on_error, initial=options.get("initial", "tail"),
            sources=sources, order=order or oldest_first, lanes=lanes,
            handler_timeout=handler_timeout, lane_window=lane_window, pipeline=pipeline,
            state_cache_bytes=state_cache_bytes,
        )  # fmt: skip


def _refuse_ignored(
    what: str, mode: str, workers: Any, on_error: str, sources: Any, order: Any
) -> None:
    """Options that would be accepted and do nothing (or worse), refused where defined."""
    if order is not None and not sources:
        raise InvalidInputError(
            f"{what}: order= merges the events of several sources, and this one reads its "
            "store alone (give sources= too, or leave order= out)"
        )
    if workers is not None and mode == "tracking":
        raise InvalidInputError(
            f"{what}: workers= sizes the pooled mode's handler threads; mode='tracking' runs "
            "a thread per segment (leave workers= out, or use mode='pooled')"
        )
    if on_error == "dead_letter" and sources:
        # a parked event is kept by its position in this store: another store's would be
        # retried as this store's event of the same position
        raise InvalidInputError(
            f"{what}: on_error='dead_letter' parks events of this store only, and this one "
            "reads other stores too (sources=): use on_error='retry'"
        )


def _lanes(
    name: str, kind: str, guarantee: Guarantee, options: ProcessorOptions
) -> tuple[int, float, int, bool]:
    """The lanes, handler timeout, lane window and pipeline, checked against the guarantee
    and the kind (the rest of :meth:`RunOptions.check`)."""
    what, plain = f"processor {name!r}", kind == "processor"
    lanes = options.get("lanes", 1)
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise InvalidInputError(f"{what}: lanes must be >= 1, got {lanes!r}")
    if lanes > 1 and guarantee is Guarantee.EXACTLY_ONCE:
        raise InvalidInputError(
            f"{what}: lanes={lanes} run handlers outside the token's transaction; declare "
            "guarantee='at-least-once' (and make effects idempotent)"
        )
    if lanes > 1 and not plain:
        raise InvalidInputError(
            f"{kind} {name!r}: lanes={lanes} are for app.processor(..., "
            "guarantee='at-least-once') handlers"
        )
    if guarantee is not Guarantee.EXACTLY_ONCE and options.get("on_error") == "dead_letter":
        raise InvalidInputError(
            f"{kind} {name!r}: dead letters are parked in the token's transaction; "
            "on_error='dead_letter' needs guarantee='exactly-once'"
        )
    handler_timeout = check_seconds(
        options.get("handler_timeout", 30.0), f"{what}: handler_timeout"
    )
    lane_window = options.get("lane_window")
    if lane_window is not None and (
        isinstance(lane_window, bool) or not isinstance(lane_window, int) or lane_window < 1
    ):
        raise InvalidInputError(f"{what}: lane_window must be >= 1")
    if lane_window is not None and (guarantee is not Guarantee.AT_LEAST_ONCE or not plain):
        raise InvalidInputError(  # it would be ignored: refused instead
            f"{kind} {name!r}: lane_window bounds the events in flight in the lanes of an "
            "app.processor(..., guarantee='at-least-once'); this one has none"
        )
    pipeline = options.get("pipeline", False)
    if not isinstance(pipeline, bool):
        raise InvalidInputError(f"{what}: pipeline must be True or False")
    if pipeline and (guarantee is not Guarantee.EXACTLY_ONCE or not plain):
        raise InvalidInputError(
            f"{kind} {name!r}: pipeline=True pipelines the batch's transaction of "
            "exactly-once handlers; this one has none"
        )
    window = 1000 if lane_window is None else lane_window
    return lanes, float(handler_timeout), window, pipeline


def _state_cache_bytes(name: str, kind: str, options: ProcessorOptions) -> int:
    """The bytes of states an aggregation caches per process: a whole number >= 1; refused
    elsewhere (it would be ignored)."""
    if "state_cache_bytes" not in options:
        return STATE_CACHE_BYTES
    value = options["state_cache_bytes"]
    if kind != "aggregation":
        raise InvalidInputError(
            f"{kind} {name!r}: state_cache_bytes bounds the states an app.aggregation(...) "
            "caches; this one has none"
        )
    if not _count(value):
        raise InvalidInputError(
            f"aggregation {name!r}: state_cache_bytes must be a whole number of bytes >= 1, "
            f"got {value!r}"
        )
    return value


def _count(value: object) -> bool:
    """A whole number from one (True is an int to Python, not a count)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _tables(name: str, tables: object) -> tuple[str, ...]:
    if isinstance(tables, str) or not isinstance(tables, list | tuple):
        raise InvalidInputError(
            f"processor {name!r}: tables= is a list of table names, got {tables!r}"
        )
    try:
        return tuple(check_table_name(t) for t in tables)
    except ValueError as exc:
        raise InvalidInputError(f"processor {name!r}: tables=: {exc}") from None


def _guarantee(name: str, value: object) -> Guarantee:
    if isinstance(value, str) and value in {g.value for g in Guarantee}:
        return Guarantee(value)
    choices = f"{Guarantee.EXACTLY_ONCE.value!r}, {Guarantee.AT_LEAST_ONCE.value!r}"
    raise InvalidInputError(
        f"processor {name!r}: guarantee must be one of {choices}, got {value!r}"
    )


def validate_sources(sources: dict[str, Any] | None) -> dict[str, Any]:
    if sources is None:
        return {}
    if not isinstance(sources, dict):
        raise InvalidInputError("sources must be a dict of name -> store URL or EventStore")
    for name, target in sources.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInputError(
                f"invalid source name {name!r}: 1-31 lowercase letters, digits, '_'"
            )
        if not isinstance(target, str | EventStore):
            raise InvalidInputError(f"source {name!r} must be a store URL or an EventStore")
    return dict(sources)


def oldest_first(event: Event) -> tuple[Any, ...]:
    """Default merge order: recorded_at, then source name, then position."""
    recorded = recorded_raw(event)  # microseconds on both backends, a datetime if converted
    micros = recorded if isinstance(recorded, int) else int(recorded.timestamp() * 1_000_000)
    return (micros, event.source, event.position)
