"""A processor's definition: its name, handlers and how it runs (not the running itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from ..errors import InvalidInputError
from ..names import check_table_name, table_suffix, validate_base_name, versioned_name
from ..tokens.base import Initial
from ..upcasting import Upcasters
from .handlers import Handler, HandlerSet, ResetHandler, check_types
from .options import Guarantee, ProcessorOptions, RunOptions


class Processor:
    """Named consumer of the store. Many processes with the same name share its segments.

    Made by the App's factories, which pass what the definition needs from the app: the
    store's table ``prefix`` (known without connecting) and its ``upcasters``."""

    #: what this kind of processor is called in messages
    kind = "processor"
    #: its versions route events alike (checked where both are defined): the replays of a new
    #: version follow the parts of the old one's segments exactly
    routes_as_versions = True

    def __init__(
        self,
        name: str,
        *,
        prefix: str,
        upcasters: Upcasters,
        **options: Unpack[ProcessorOptions],
    ) -> None:
        #: the name it was defined with; ``name`` is the stored one (``orders@v2``)
        self.base = validate_base_name(name)
        #: the options checked (:class:`~eventlanes.processing.options.RunOptions`); each is
        #: also an attribute of its own name, which is what the executors read
        self.options = run = RunOptions.check(name, self.kind, options)
        #: ``version=N``: a new version of processor ``base`` with its own tokens and tables
        #: (``eventlanes.admin.versions``); 1, the default, is the processor as it always was
        self.version = run.version
        self.name = versioned_name(self.base, self.version)
        #: the tables its handlers build (``ctx.table`` names): what ``app.table(name)``
        #: looks up and what retiring a version drops
        self.tables = run.tables
        self.guarantee = run.guarantee
        self.segments = run.segments
        self.policy = run.policy
        self.batch_size = run.batch_size
        self.mode = run.mode
        self.max_segments = run.max_segments
        self.workers = run.workers
        self.on_error = run.on_error
        self.initial = run.initial
        #: other stores to read besides the app's own: name -> URL or EventStore
        self.sources = run.sources
        self.order = run.order
        self.lanes = run.lanes
        self.handler_timeout = run.handler_timeout
        #: events in flight in a segment's lanes (backpressure; at-least-once processors)
        self.lane_window = run.lane_window
        #: PostgreSQL pipeline mode for exactly-once batches (see executors.exactly_once)
        self.pipeline = run.pipeline
        #: the store's table prefix, for :meth:`table`
        self.prefix = prefix
        #: the app's upcasters: the types they turn into others are refused here, and readers
        #: read this processor's events in their current shapes (``eventlanes.upcasting``)
        self.upcasters = upcasters
        self.handlers = HandlerSet(self.name)

    def on(self, *types: str) -> Callable[[Handler], Handler]:
        """Decorator: handle events of these types (``@proc.on("FrontWheelAdded")``)."""
        check_types(f"processor {self.name!r}", "on()", types)

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
        check_types(f"processor {self.name!r}", "on_batch()", types, empty=True)
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
        """The event types this processor handles (None: all); the others are passed over."""
        return self.handlers.types()

    def read_types(self) -> frozenset[str] | None:
        """The event types its reader reads (None: all): the handled ones here."""
        return self.handled_types()

    @property
    def handler_threads(self) -> int:
        """The pooled mode's handler threads: ``workers``, or one per segment (handlers that
        wait on a database or the network wait side by side)."""
        return self.workers or max(1, self.segments)

    def refuse_upcast(self, types: tuple[str, ...] | frozenset[str]) -> None:
        """Refuse handling a type that an upcaster turns into another: its handler would never
        run (``eventlanes.upcasting``)."""
        self.upcasters.refuse_handled(types, f"{self.kind} {self.name!r}")

    def table(self, name: str) -> str:
        """The full name of this version's table ``name`` (what ``ctx.table(name)`` gives its
        handlers): the store's prefix, the name, and ``__vN`` from version 2 on; for the DDL
        that creates it and for readers of this version."""
        return f"{self.prefix}{check_table_name(name)}{table_suffix(self.name)}"

    def token_spec(self) -> tuple[str, int, Initial, tuple[str, ...], bool]:
        """What the token store needs to create this processor's rows: for a version, the
        earlier versions whose handled events are replays for it, and whether their segments'
        parts can be mapped onto its own (they route events as it does)."""
        earlier = tuple(versioned_name(self.base, v) for v in range(1, self.version))
        return self.name, self.segments, self.initial, earlier, self.routes_as_versions

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


def check_versions(old: Processor, new: Processor) -> None:
    """Two versions of one processor must be the same kind and, where replays are told per
    part, route events alike: a new version's replays are the events the old one had handled,
    known per segment of the old one's routing."""
    low, high = sorted((old, new), key=lambda p: p.version)
    if type(low) is not type(high):
        raise InvalidInputError(
            f"{high.kind} {high.name!r} is version {high.version} of {low.kind} {low.name!r}: "
            "versions of a processor must be of the same kind"
        )
    if high.routes_as_versions and low.policy.routing != high.policy.routing:
        raise InvalidInputError(
            f"processor {high.name!r} routes events by {high.policy.name}, its version "
            f"{low.version} by {low.policy.name}: a new version must route as the old one "
            "does (the events the old one had handled are known per segment of its routing); "
            "pass the same policy to both (one function object for a custom one)"
        )
