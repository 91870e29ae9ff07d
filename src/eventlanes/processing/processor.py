"""A processor's definition: its name, handlers and how it runs (not the running itself)."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..callables import check
from ..errors import InvalidInputError
from ..names import table_suffix, validate_base_name, validate_version, versioned_name
from ..policies import KeyFunction, SequencingPolicy, as_policy
from ..segments import Segment
from ..tokens.base import Initial
from .handlers import Handler, HandlerSet, ResetHandler
from .handling.context import check_table_name
from .options import OrderKey, oldest_first, validate_sources

if TYPE_CHECKING:
    from .runtime import Runtime

MODES = ("pooled", "tracking")
ERROR_MODES = ("retry", "dead_letter")


class Guarantee(StrEnum):
    """What a processor promises about its effects; shown by ``status``."""

    #: handlers' writes (``ctx.execute``) and the token commit in one transaction
    EXACTLY_ONCE = "exactly-once"
    #: handlers run outside the token's transaction (lanes, side effects); after a crash the
    #: events past the stored token run again, so effects must be idempotent
    AT_LEAST_ONCE = "at-least-once"
    #: folds deduplicated by source offsets, states written with the token (aggregations)
    AGGREGATION = "aggregation"


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


class Processor:
    """Named consumer of the store. Many processes with the same name share its segments."""

    #: what this kind of processor is called in messages
    _kind = "processor"
    #: its versions route events alike (checked where both are defined): the replays of a new
    #: version follow the parts of the old one's segments exactly
    _routes_as_versions = True

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        *,
        guarantee: str = "exactly-once",
        segments: int = 1,
        policy: SequencingPolicy | KeyFunction | None = None,
        batch_size: int = 500,
        mode: str = "pooled",
        max_segments: int | None = None,
        workers: int | None = None,
        on_error: str = "retry",
        initial: Initial = "tail",
        sources: dict[str, Any] | None = None,
        order: OrderKey | None = None,
        lanes: int = 1,
        handler_timeout: float = 30.0,
        lane_window: int | None = None,
        pipeline: bool = False,
        version: int = 1,
        tables: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.runtime = runtime
        #: the name it was defined with; ``name`` is the stored one (``orders@v2``)
        self.base = validate_base_name(name)
        #: ``version=N``: a new version of processor ``base`` with its own tokens and tables
        #: (``eventlanes.admin.versions``); 1, the default, is the processor as it always was
        self.version = validate_version(version, name)
        self.name = versioned_name(self.base, self.version)
        #: the tables its handlers build (``ctx.table`` names): what ``app.table(name)``
        #: looks up and what retiring a version drops
        self.tables = _tables(name, tables)
        self.guarantee = _guarantee(name, guarantee)
        if self.guarantee is Guarantee.AGGREGATION and type(self) is Processor:
            raise InvalidInputError(
                f"processor {name!r}: guarantee 'aggregation' is for app.aggregation(...)"
            )
        try:
            Segment.initial(segments)
        except ValueError as exc:
            raise InvalidInputError(f"processor {name!r}: {exc}") from None
        self.segments = segments
        self.policy = as_policy(policy, f"processor {name!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(
                f"processor {name!r}: batch_size must be >= 1, got {batch_size!r}"
            )
        self.batch_size = batch_size
        if mode not in MODES:
            raise InvalidInputError(
                f"processor {name!r}: mode must be one of {MODES}, got {mode!r}"
            )
        self.mode = mode
        if max_segments is not None and (not isinstance(max_segments, int) or max_segments < 1):
            raise InvalidInputError(f"processor {name!r}: max_segments must be >= 1")
        self.max_segments = max_segments
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise InvalidInputError(f"processor {name!r}: workers must be >= 1")
        self.workers = workers
        if on_error not in ERROR_MODES:
            raise InvalidInputError(
                f"processor {name!r}: on_error must be one of {ERROR_MODES}, got {on_error!r}"
            )
        self.on_error = on_error
        self.initial = initial
        #: other stores to read besides the app's own: name -> URL or EventStore
        self.sources = validate_sources(sources)
        if order is not None:
            check(order, f"processor {name!r}: order=", ("event",),
                  why_sync="the merge compares the keys at once")  # fmt: skip
        self.order = order or oldest_first
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise InvalidInputError(f"processor {name!r}: lanes must be >= 1, got {lanes!r}")
        if lanes > 1 and self.guarantee is Guarantee.EXACTLY_ONCE:
            raise InvalidInputError(
                f"processor {name!r}: lanes={lanes} run handlers outside the token's "
                "transaction; declare guarantee='at-least-once' (and make effects idempotent)"
            )
        if lanes > 1 and type(self) is not Processor:  # would be ignored: refused instead
            raise InvalidInputError(
                f"{self._kind} {name!r}: lanes={lanes} are for app.processor(..., "
                "guarantee='at-least-once') handlers"
            )
        if self.guarantee is not Guarantee.EXACTLY_ONCE and on_error == "dead_letter":
            raise InvalidInputError(
                f"{self._kind} {name!r}: dead letters are parked in the token's transaction; "
                "on_error='dead_letter' needs guarantee='exactly-once'"
            )
        if not isinstance(handler_timeout, int | float) or handler_timeout <= 0:
            raise InvalidInputError(f"processor {name!r}: handler_timeout must be > 0 seconds")
        if lane_window is not None and (
            isinstance(lane_window, bool) or not isinstance(lane_window, int) or lane_window < 1
        ):
            raise InvalidInputError(f"processor {name!r}: lane_window must be >= 1")
        if lane_window is not None and (
            self.guarantee is not Guarantee.AT_LEAST_ONCE or type(self) is not Processor
        ):  # would be ignored: refused instead
            raise InvalidInputError(
                f"{self._kind} {name!r}: lane_window bounds the events in flight in the lanes "
                "of an app.processor(..., guarantee='at-least-once'); this one has none"
            )
        self.lanes = lanes
        self.handler_timeout = float(handler_timeout)
        #: events in flight in a segment's lanes (backpressure; at-least-once processors)
        self.lane_window = 1000 if lane_window is None else lane_window
        if not isinstance(pipeline, bool):
            raise InvalidInputError(f"processor {name!r}: pipeline must be True or False")
        if pipeline and (
            self.guarantee is not Guarantee.EXACTLY_ONCE or type(self) is not Processor
        ):
            raise InvalidInputError(
                f"{self._kind} {name!r}: pipeline=True pipelines the batch's transaction of "
                "exactly-once handlers; this one has none"
            )
        #: PostgreSQL pipeline mode for exactly-once batches (see worker.SegmentWorker)
        self.pipeline = pipeline
        self.handlers = HandlerSet(self.name)

    def on(self, *types: str) -> Callable[[Handler], Handler]:
        """Decorator: handle events of these types (``@proc.on("FrontWheelAdded")``)."""
        if not types or not all(isinstance(t, str) and t for t in types):
            raise InvalidInputError(f"processor {self.name!r}: on() needs event type names")

        self.refuse_upcast(types)

        def register(handler: Handler) -> Handler:
            self.handlers.add(frozenset(types), handler)
            return handler

        return register

    def on_any(self, handler: Handler) -> Handler:
        """Decorator: handle every event."""
        self.handlers.add(None, handler)
        return handler

    def on_batch(self, *types: str) -> Callable[[Handler], Handler]:
        """Decorator: ``handler(events, ctx)`` once per segment batch with its events (of these
        types; all when none are given), in order, in the batch's transaction. For projections
        that fold many events into one write. A failure retries the whole batch (also in
        dead-letter mode: no single event can be blamed)."""
        if not all(isinstance(t, str) and t for t in types):
            raise InvalidInputError(f"processor {self.name!r}: on_batch() takes event type names")
        if self.guarantee is not Guarantee.EXACTLY_ONCE:
            raise InvalidInputError(
                f"processor {self.name!r} is {self.guarantee.value}: on_batch handlers run in "
                "the token's transaction, which only exactly-once processors have"
            )

        self.refuse_upcast(types)

        def register(handler: Handler) -> Handler:
            self.handlers.add_batch(frozenset(types) if types else None, handler)
            return handler

        return register

    def on_reset(self, handler: ResetHandler) -> ResetHandler:
        """Decorator: run ``handler(ctx)`` in the reset's transaction (e.g. clear a table)."""
        self.handlers.add_reset(handler)
        return handler

    def handled_types(self) -> frozenset[str] | None:
        """The event types this processor reads (None: all); the others are passed over."""
        return self.handlers.types()

    def refuse_upcast(self, types: tuple[str, ...] | frozenset[str]) -> None:
        """Refuse handling a type that an upcaster turns into another: its handler would never
        run (``eventlanes.upcasting``)."""
        self.runtime.upcasters.refuse_handled(types, f"{self._kind} {self.name!r}")

    def table(self, name: str) -> str:
        """The full name of this version's table ``name`` (what ``ctx.table(name)`` gives its
        handlers): the store's prefix, the name, and ``__vN`` from version 2 on; for the DDL
        that creates it and for readers of this version."""
        return f"{self.runtime.prefix}{check_table_name(name)}{table_suffix(self.name)}"

    def token_spec(self) -> tuple[str, int, Initial, tuple[str, ...], bool]:
        """What the token store needs to create this processor's rows: for a version, the
        earlier versions whose handled events are replays for it, and whether their segments'
        parts can be mapped onto its own (they route events as it does)."""
        earlier = tuple(versioned_name(self.base, v) for v in range(1, self.version))
        return self.name, self.segments, self.initial, earlier, self._routes_as_versions

    def describe(self) -> dict[str, Any]:
        """What the processor is, for start lines and status: name, guarantee, mode, segments,
        policy, batch size and ``on_error``."""
        return {
            "name": self.name,
            "guarantee": self.guarantee.value,
            "mode": self.mode,
            "segments": self.segments,
            "policy": self.policy.name,
            "batch_size": self.batch_size,
            "on_error": self.on_error,
        }

    def __repr__(self) -> str:
        how = f"{self.guarantee.value}, {self.mode}, {self.segments} segments"
        return f"<{type(self).__name__} {self.name} ({how})>"
