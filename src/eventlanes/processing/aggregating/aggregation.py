"""Exactly-once aggregations of non-idempotent folds (sums, counters).

State lives in memory and is written every ``persist_every`` seconds (conflated per key), in one
transaction with the segment's token, so the token never passes an event whose effect is not
stored. Each state row also keeps, per source, the newest source coordinates folded in
(``chains.py``); an input that is not newer is dropped and counted: duplicates re-appended by a
republisher that crashed before committing its token are never counted twice.

A fold may return outputs (a flat map) for a downstream stage (``agg.downstream(...)``). Outputs
of one input are applied together; the downstream stage is persisted first, then this stage and
its token, so a crash in between only re-emits outputs that the downstream stage drops.

Table ``{prefix}aggregates``: (aggregation, key) primary key, ``value`` (JSON), ``offsets``
(JSON: source -> [partition, path]), ``dropped`` (inputs dropped as already folded),
``updated_at`` (epoch ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Unpack

from ...callables import check
from ...errors import InvalidInputError
from ...events import Event
from ...names import validate_base_name, validate_processor_name, versioned_name
from ...policies import FieldPolicy, SequencingPolicy, key_argument
from ...tokens.base import check_seconds
from ...upcasting import Upcasters
from ...windows.kinds import Session
from ...windows.spec import (
    DEFAULT_RETAIN,
    LateEvent,
    Windowing,
    WindowResult,
    instant,
    windowing,
)
from ...windows.ticks import TICK
from ..handlers import FunctionsByType
from ..options import AggregationOptions
from ..processor import Processor
from ..tables.states import StateTable
from ..tables.windows import WindowTable
from .declarative import Declaration, Op
from .folds import check_fresh_state
from .publish import sink_of

log = logging.getLogger("eventlanes.aggregation")
Fold = Callable[[Any, Event], Any]


class _FieldKey:
    """``key="robot"``: the property's value, as ``key=lambda e: e.data["robot"]`` gives it;
    the fold keeps a string and refuses anything else (``policies.state_key``), as Spark
    does, so both key forms and both engines agree on every datum."""

    def __init__(self, field: str, name: str) -> None:
        self.field = field
        self.name = name

    def __call__(self, event: Event) -> Any:
        data = event.data
        if self.field not in data:
            raise InvalidInputError(
                f"event {event.position} ({event.type}): no key property {self.field!r} for "
                f"aggregation {self.name!r}"
            )
        return data[self.field]


def _check_callables(name: str, key: Any, initial: Any) -> None:
    what = f"aggregation {name!r}"
    check(key, f"{what}: key", ("event",), why_sync="the key routes the event before it is read")
    check(initial, f"{what}: initial", (), why_sync="it makes a fresh state when one is needed")


def _windowed_pushdown(
    name: str, windowing: Windowing | None, options: Any, pushdown: bool
) -> bool:
    """``pushdown`` (a windowed aggregation's windows are folded in SQLite where exact:
    ``windowing/pushdown.py``); what a windowed one cannot do yet, refused."""
    if windowing is not None and options.get("sources"):
        raise InvalidInputError(f"aggregation {name!r}: windows read one source")
    return pushdown


def _refuse_unmergeable(name: str, windowing: Windowing | None, decl: Declaration) -> None:
    """Session windows merge their states: a declared first or last value cannot be merged
    (which input came first in the log is not kept), so it is refused."""
    if windowing is None or not isinstance(windowing.window, Session):
        return
    for out, op in decl.fields.items():
        if op.kind in ("first", "last"):
            raise InvalidInputError(
                f"aggregation {name!r}: field {out!r} is el.{op.kind}(): session windows merge "
                "their states and cannot merge a first or last value; use el.min or el.max "
                "of a time, or tumbling or hopping windows"
            )


class Stage:
    """A downstream aggregation, fed by the outputs of an upstream aggregation's folds."""

    def __init__(
        self, upstream: Aggregation, name: str, key: Any, initial: Any, publish: Any = None
    ) -> None:
        validate_processor_name(name)
        _check_callables(name, key, initial)
        check_fresh_state("stage", name, initial)  # a stage has no stages of its own
        self.publish = sink_of(name, publish, upstream.version)
        self.upstream = upstream
        self.name = name
        self.key = key
        self.initial = initial
        self.folds = FunctionsByType(f"stage {name!r}")
        self.on = self.folds.on

    def get(self, key: str) -> Any:
        """The stage's state of ``key`` (a string) as last written (None when there is
        none)."""
        return self.upstream.states.get(self.name, key_argument(key, f"stage {self.name!r}"))

    def dropped(self) -> int:
        """Outputs dropped because they were already folded in (repeats after a crash)."""
        return self.upstream.states.dropped(self.name)


class Aggregation(Processor):
    """``app.aggregation(name, key=..., initial=..., persist_every=1.0)``; ``@agg.on(type)``
    registers ``fold(state, event)``, which updates ``state`` in place (or returns outputs for
    a downstream stage).

    ``batch_size``: the events read at a time by rows (states are written every
    ``persist_every`` seconds whatever it is). A declarative aggregation (``fields=``) over a
    SQLite store is folded inside SQLite over larger ranges when that is exact
    (:mod:`.pushdown`); ``pushdown=False`` always folds by rows. ``states()``: the table
    the states are written to (opened on first use)."""

    kind = "aggregation"
    #: a new version may fold by another key (routing otherwise): its replay flags (shown by
    #: status; folds do not depend on them) take only what every part of the old one passed
    routes_as_versions = False

    # long: every option checked where it is taken, against the ones it depends on
    def __init__(
        self,
        name: str,
        *,
        key: Callable[[Event], Any] | str,
        initial: Callable[[], Any] | None = None,
        persist_every: float = 1.0,
        fields: dict[str, Op] | None = None,
        on: str | list[str] | None = None,
        pushdown: bool = True,
        publish: Any = None,
        states: Callable[[], StateTable],
        prefix: str,
        upcasters: Upcasters,
        window: Any = None,
        time: Any = None,
        lateness: Any = "0s",
        max_future: Any = None,
        clock: str = "store",
        late: str = "park",
        retain: Any = DEFAULT_RETAIN,
        idle_close: Any = None,
        tick_lag: Any = "0s",
        windows: Callable[[], WindowTable] | None = None,
        **options: Unpack[AggregationOptions],
    ) -> None:
        #: window=...: each key's inputs folded per time window (eventlanes.windows)
        self.windowing = windowing(
            name, window, time, lateness, max_future, clock, late, retain, idle_close, tick_lag
        )
        self._windows = windows
        #: on_close() functions: called with each window closed or amended
        self.closers: list[Callable[[WindowResult], Any]] = []
        #: on_merge(): merges two session windows' states (Python folds with el.session)
        self.merger: Callable[[Any, Any], Any] | None = None
        pushdown = _windowed_pushdown(name, self.windowing, options, pushdown)
        # key="robot" (a data property) is the same as key=lambda e: e.data["robot"], and lets
        # Spark extract it natively instead of calling Python for every event.
        self.key_field = key if isinstance(key, str) and key else None
        key_fn: Callable[[Event], Any]
        key_fn = _FieldKey(key, name) if isinstance(key, str) and key else key  # type: ignore[assignment]
        self.folds = FunctionsByType(f"aggregation {name!r}")
        #: fields=...: a declarative aggregation (declarative.py), folded without Python per event
        self.declaration: Declaration | None = None
        if fields is not None or on is not None:
            if initial is not None:
                raise InvalidInputError(
                    f"aggregation {name!r}: declared fields start from their own initial values "
                    "(count and sum 0, the others null): drop initial="
                )
            decl = self.declaration = Declaration.build(name, key, on, fields)
            _refuse_unmergeable(name, self.windowing, decl)
            key_fn, initial = decl.key_of, decl.initial
            for t in sorted(decl.types):
                self.folds.by_type[t] = [decl.fold]  # the per-event path (continuous mode)
        _check_callables(name, key_fn, initial)
        self.key: Callable[[Event], Any] = key_fn
        folds = self.folds

        # Route by the aggregation key so each key's state lives in exactly one segment; events
        # no fold handles have no key (and are skipped).
        def route(event: Event) -> Any:
            if not folds.handles(event.type):
                return None
            try:
                return key_fn(event)
            except Exception:  # noqa: BLE001 - the segment's worker fails on it, clearly
                return None

        policy: SequencingPolicy
        if isinstance(key, str) and key:  # key="robot": routed a batch at a time
            policy = FieldPolicy(route, f"aggregation({name})", key, folds.handles)
        else:
            policy = SequencingPolicy(route, f"aggregation({name})")
        if "guarantee" in options:
            raise InvalidInputError(f"aggregation {name!r}: the guarantee is 'aggregation'")
        super().__init__(
            name, prefix=prefix, upcasters=upcasters, policy=policy, guarantee="aggregation",
            **options,
        )  # fmt: skip
        self._states = states
        what = f"aggregation {name!r}: persist_every"
        self.persist_every = check_seconds(persist_every, what, zero=True)  # nan, inf: refused
        #: bytes of states each worker process caches (checked with the other options)
        self.state_cache_bytes = self.options.state_cache_bytes
        self.initial_state: Callable[[], Any] = initial  # type: ignore[assignment]
        self.stages: list[Stage] = []
        if self.declaration is not None:
            self.refuse_upcast(self.declaration.types)
        if not isinstance(pushdown, bool):
            raise InvalidInputError(f"aggregation {name!r}: pushdown must be True or False")
        #: fold declared fields inside SQLite where exact (pushdown.py)
        self.pushdown = pushdown
        #: a KafkaSink: each state written is published first (kafka/sink.py)
        self.publish = sink_of(name, publish, self.version)
        #: events this process folded inside SQLite (for tests and tuning)
        self.pushed_down = 0
        #: of those, the events merged into the stored states inside SQLite too
        self.placed = 0

    @property
    def merges_in_database(self) -> bool:
        """Its ranges folded in the database may be merged into the stored states there too
        (:mod:`.pushdown`): not when each state written is published, which needs it in
        Python (a declarative aggregation has no downstream stages)."""
        return self.publish is None

    def on(self, *types: str) -> Callable[[Fold], Fold]:
        self._python_only("on()")
        register = self.folds.on(*types)
        self.refuse_upcast(types)
        return register

    def on_any(self, fold: Fold) -> Fold:
        self._python_only("on_any()")
        return self.folds.add_any(fold)

    def on_close(self, fn: Callable[[WindowResult], Any]) -> Callable[[WindowResult], Any]:
        """Decorator (a windowed aggregation, declared or not): ``fn(window)`` is called with
        each window as it closes and with each amendment of it, a :class:`WindowResult`; the
        ``NewEvent``s it returns (or None) are appended to the store, to stream
        ``"<name>:<key>"``, in the transaction that writes the window: exactly once. Not on a
        version from 2 on (its warm-up would close all of history again)."""
        if self.windowing is None:
            raise InvalidInputError(
                f"aggregation {self.name!r}: on_close() belongs to a windowed aggregation "
                "(window=...)"
            )
        if self.version != 1:
            raise InvalidInputError(
                f"aggregation {self.name!r}: on_close() on version {self.version} would run for "
                "every window of its warm-up (all of history closed again); use it from "
                "version 1 only, or on an aggregation of another name"
            )
        check(fn, f"aggregation {self.name!r}: on_close", ("window",),
              why_sync="its events are appended in the write that closes the window")  # fmt: skip
        self.closers.append(fn)
        return fn

    def on_merge(self, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """Decorator (session windows with Python folds): ``fn(into, other)`` merges the state
        ``other`` into ``into`` in place when an input bridges two sessions of a key (``into``:
        the session that started first). Declared fields merge by themselves."""
        what = f"aggregation {self.name!r}"
        if self.windowing is None or not isinstance(self.windowing.window, Session):
            raise InvalidInputError(
                f"{what}: on_merge() belongs to an aggregation with session windows "
                "(window=el.session(...))"
            )
        self._python_only("on_merge()")
        if self.merger is not None:
            raise InvalidInputError(f"{what}: it has a merge function already")
        check(fn, f"{what}: on_merge", ("into", "other"),
              why_sync="the merged state is folded into at once")  # fmt: skip
        self.merger = fn
        return fn

    def _python_only(self, what: str) -> None:
        if self.declaration is not None:
            raise InvalidInputError(
                f"aggregation {self.name!r} is declarative (fields=...): {what} needs a Python "
                "fold; define another aggregation for it"
            )

    def downstream(
        self,
        name: str,
        key: Callable[[Any], Any],
        initial: Callable[[], Any],
        publish: Any = None,
    ) -> Stage:
        """A stage fed with this aggregation's fold outputs (``NewEvent``s), or with a windowed
        one's closed windows (a ``WindowResult`` event each time a window closes or is
        amended, its data the published record's value); ``publish``: a KafkaSink its states
        are published to before they are written."""
        if self.windowing is None:
            self._python_only("downstream()")
        # A version's stages keep states of their own, as it does (``stage@vN``).
        name = versioned_name(validate_base_name(name), self.version)
        stage = Stage(self, name, key, initial, publish)
        self.stages.append(stage)
        return stage

    def handled_types(self) -> frozenset[str] | None:
        return self.folds.types()

    def read_types(self) -> frozenset[str] | None:
        """The folded types, and the ticks that move a windowed aggregation's clock when its
        inputs stop (``idle_close=``)."""
        types = self.handled_types()
        if types is None or self.windowing is None or self.windowing.idle_close is None:
            return types
        return types | {TICK}

    @property
    def handler_threads(self) -> int:
        """``workers``, or one: folds compute in Python, and threads only queue for its one
        interpreter lock (each state load gave it up and waited to get it back: 4 segments
        on 4 threads loaded the same states 15 times slower than on one)."""
        return self.workers or 1

    @property
    def states(self) -> StateTable:
        """The table the states are written to."""
        return self._states()

    def get(self, key: str) -> Any:
        """The persisted state of ``key`` (a string; None if nothing was folded for it yet)."""
        if self.windowing is not None:
            raise InvalidInputError(
                f"aggregation {self.name!r} is windowed: read its windows with windows(key)"
            )
        return self.states.get(self.name, key_argument(key, f"aggregation {self.name!r}"))

    def _window_rows(self) -> WindowTable:
        if self.windowing is None or self._windows is None:
            raise InvalidInputError(f"aggregation {self.name!r} has no windows (window=...)")
        return self._windows()

    def windows(
        self, key: str, since: datetime | int | None = None, until: datetime | int | None = None
    ) -> list[WindowResult]:
        """The windows of ``key`` written so far (open ones as last written, closed ones
        kept for ``retain``), in time order; ``since``/``until`` (aware datetimes or
        microseconds since the epoch): those ending after ``since`` and starting before
        ``until``."""
        what = f"aggregation {self.name!r}"
        return self._window_rows().windows(
            self.name, key_argument(key, what), instant(since, f"{what}: since"),
            instant(until, f"{what}: until"),
        )  # fmt: skip

    def late_events(self, key: str | None = None) -> list[LateEvent]:
        """The late inputs kept (``late="park"`` or ``"amend"``), in log order."""
        what = f"aggregation {self.name!r}"
        return self._window_rows().late(self.name, None if key is None else key_argument(key, what))

    def window_counts(self) -> dict[str, int]:
        """Inputs folded, late (for at least one of their windows), duplicate (dropped by
        their source chain) and clamped (time past ``recorded_at`` + ``max_future``): every
        input read is folded, late or a duplicate."""
        counts = self._window_rows().counts(self.name)
        return {**counts, "duplicate": self.dropped()}

    def dropped(self) -> int:
        """Inputs dropped because they were already folded in (duplicates)."""
        return self.states.dropped(self.name)
