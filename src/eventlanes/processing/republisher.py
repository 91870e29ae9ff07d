"""Republishers: consume events, append derived events carrying their source chain.

A republisher appends its outputs in a transaction of its own (the target may be another store)
and commits its token afterwards: it is at-least-once. If it crashes between the two it appends
the same outputs again on restart; every output carries ``metadata["source_chain"]`` back to its
root event, so aggregations downstream drop the repeats (exactly-once overall).

A handler returns an ``el.NewEvent``, a list of them (a flat map), or None. All outputs of a
batch for one target stream are appended in one atomic append, so the outputs of one input are
never stored partially.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..callables import check
from ..errors import ClaimLostError, InvalidInputError
from ..events import Event, NewEvent, encode_object
from ..policies import key_text
from ..store import EventStore
from ..tracing import propagation, spans
from .chains import CHAIN_KEY, extend_chain
from .dispatch import Awaiter, HandlerFailed
from .handlers import FunctionsByType
from .processor import Processor
from .state import Outcome, SegmentState, advanced
from .worker import SegmentWorker

if TYPE_CHECKING:
    from .runtime import Runtime

Republish = Callable[[Event], Any]


class Republisher(Processor):
    _kind = "republisher"

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        *,
        to_stream: str | Callable[[Event], str],
        to_store: str | EventStore | None = None,
        **options: Any,
    ) -> None:
        if "guarantee" in options:
            raise InvalidInputError(
                f"republisher {name!r}: the guarantee is 'at-least-once' (outputs are appended "
                "before the token; source chains let aggregations drop the repeats)"
            )
        if options.get("version", 1) != 1:
            raise InvalidInputError(
                f"republisher {name!r}: versions are for projections and aggregations; a second "
                "version of a republisher would append the outputs of all history again (its "
                "mappings run on replays too): define a republisher of another name"
            )
        super().__init__(runtime, name, guarantee="at-least-once", **options)
        if not (isinstance(to_stream, str) and to_stream):
            if not callable(to_stream):
                raise InvalidInputError(
                    f"republisher {name!r}: to_stream must be a name or function"
                )
            check(to_stream, f"republisher {name!r}: to_stream", ("event",),
                  why_sync="the stream is named when the outputs are appended")  # fmt: skip
        self.to_stream = to_stream
        self.to_store = to_store
        self.functions = FunctionsByType(
            f"republisher {name!r}", role="mapping", params=("event",), awaited=True
        )

    def on(self, *types: str) -> Callable[[Republish], Republish]:  # type: ignore[override]
        """Decorator: ``fn(event)`` returns an ``el.NewEvent``, a list of them, or None (an
        ``async def`` is awaited, one event at a time)."""
        register = self.functions.on(*types)
        self.refuse_upcast(types)
        return register

    def on_any(self, fn: Republish) -> Republish:  # type: ignore[override]
        """Decorator: ``fn(event)`` for every event (as :meth:`on`); only for a republisher
        appending to another store (``to_store=``): it would read its own outputs again."""
        if self.to_store is None:
            raise InvalidInputError(
                f"republisher {self.name!r}: on_any maps every event of the store it appends "
                "to, its own outputs too, so it would republish them forever: name the types "
                "it maps with on(...) (outputs of other types), or append to another store "
                "(to_store=)"
            )
        return self.functions.add_any(fn)

    def handled_types(self) -> frozenset[str] | None:
        return self.functions.types()

    def target(self) -> EventStore:
        """The store the outputs are appended to (the app's own unless ``to_store``)."""
        if self.to_store is None:
            return self.runtime.store
        if isinstance(self.to_store, str):
            return self.runtime.source_store(self.to_store)
        return self.to_store  # an EventStore, or anything with its append()


class RepublishWorker(SegmentWorker):
    def __init__(self, runtime: Runtime, rep: Republisher, owner: str) -> None:
        super().__init__(runtime, rep, owner)
        self.rep = rep
        self.target = rep.target()
        self.source = runtime.store.events_table
        #: it appends to the store it reads: an output of a type it maps would come back
        self.loops = _same_store(self.target, runtime.store)

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        awaiter = Awaiter()
        try:
            return self._process(st, events, upto, awaiter)
        finally:
            awaiter.close()

    def _process(
        self, st: SegmentState, events: list[Event], upto: int | dict[str, int], awaiter: Awaiter
    ) -> Outcome:
        per_stream: dict[str, list[NewEvent]] = {}
        traced = spans.current()  # a recording batch: a span per mapping call
        # Outputs carry the context of the mapping that made them (unless theirs names one),
        # so each leads back to its input's appending span; not into a store with trace=off.
        carry = traced is not None and getattr(self.target, "trace_context", True)
        made_by: dict[str, list[tuple[Event, int]]] = {}  # each output's input and index
        try:
            for event in events:
                for fn in self.rep.functions.for_type(event.type):
                    trace_keys: dict[str, str] = {}
                    st.watch(event)  # bounded by handler_timeout, as handlers are
                    try:
                        if traced is None:
                            produced = self._map(fn, event, awaiter)
                        else:
                            with traced.handler(event, fn) as span:
                                produced = self._map(fn, event, awaiter)
                                if carry:
                                    trace_keys = propagation.fields(span)
                    except Exception as exc:  # noqa: BLE001 - reported with the event
                        raise HandlerFailed(event, self.policy.key(event), exc) from exc
                    finally:
                        st.idle_now()
                    if produced is None:
                        continue
                    outs = produced if isinstance(produced, list) else [produced]
                    stream = self._stream(event)
                    for i, out in enumerate(outs):
                        if not isinstance(out, NewEvent):
                            raise InvalidInputError(
                                f"republisher {self.name!r} returned {type(out).__name__}, "
                                "not el.NewEvent"
                            )
                        if self.loops and self.rep.functions.handles(out.type):
                            raise InvalidInputError(
                                f"republisher {self.name!r}: output #{i} of event "
                                f"{event.position} is a {out.type!r}, a type it maps, appended "
                                "to the store it reads: it would republish its own outputs "
                                "forever; give the outputs a type of their own (or append "
                                "them to another store: to_store=)"
                            )
                        chain = extend_chain(event, self.source, i)
                        meta = {**out.metadata, CHAIN_KEY: chain}
                        if trace_keys and not any(k in meta for k in propagation.KEYS):
                            meta.update(trace_keys)
                        per_stream.setdefault(stream, []).append(NewEvent(out.type, out.data, meta))
                        made_by.setdefault(stream, []).append((event, i))
            if st.lost:  # given up on (a mapping ran past handler_timeout): append nothing
                return Outcome.LOST
            for stream, outs in per_stream.items():
                try:
                    self.target.append(stream, outs)  # its own transaction: at-least-once
                except InvalidInputError:
                    self._name_the_output(outs, made_by[stream])
                    raise
            new_token = advanced(st.token, upto)
            commit = traced.commit(new_token.position) if traced is not None else None
            try:
                self.tokens.store(self.name, st.segment.id, new_token, self.owner)
            except BaseException as exc:
                spans.ended(commit, exc)
                raise
            spans.ended(commit)
        except ClaimLostError:
            st.mark_lost()
            return Outcome.LOST
        except Exception as exc:  # noqa: BLE001
            return self.back_off(st, exc)
        st.committed(new_token)
        return Outcome.OK

    @staticmethod
    def _map(fn: Any, event: Event, awaiter: Awaiter) -> Any:
        produced = fn(event)
        if produced is not None and not isinstance(produced, NewEvent | list):
            produced = awaiter.result(produced, fn)
        return produced

    def _name_the_output(self, outs: list[NewEvent], made_by: list[tuple[Event, int]]) -> None:
        """An output the store refused (data that would not read back equal): the same error,
        naming the republisher, the input event and the output's index."""
        for out, (event, i) in zip(outs, made_by, strict=True):
            where = f"republisher {self.name!r}: output #{i} of event {event.position}"
            encode_object(out.data, f"{where} ({out.type}) data")
            encode_object(out.metadata, f"{where} ({out.type}) metadata")

    def _stream(self, event: Event) -> str:
        to = self.rep.to_stream
        if isinstance(to, str):
            return to
        return key_text(to(event), f"republisher {self.name!r}", event)


def _same_store(target: Any, store: EventStore) -> bool:
    """Whether ``target`` appends to ``store``'s events (the same object, or another handle
    on the same database and table)."""
    if target is store:
        return True
    db = getattr(target, "db", None)
    return (
        isinstance(target, EventStore)
        and db is not None
        and db.url.url == store.db.url.url
        and target.events_table == store.events_table
    )
