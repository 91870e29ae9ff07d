"""The republisher's executor: appends derived events with their source chains."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ClaimLostError, InvalidInputError
from ...events import Event, NewEvent, encode_object
from ...lineage import CHAIN_KEY, extend_chain
from ...policies import key_text
from ...tracing import propagation, spans
from ..handling.dispatch import Awaiter
from ..handling.failures import HandlerFailed
from ..republisher import Republisher, same_store
from ..segment import Outcome, SegmentState, advanced
from .base import Executor

if TYPE_CHECKING:
    from ..runtime import Runtime


class RepublishExecutor(Executor):
    def __init__(self, runtime: Runtime, rep: Republisher, owner: str) -> None:
        super().__init__(runtime, rep, owner)
        self.rep = rep
        self.target = rep.target()
        self.source = runtime.store.events_table
        #: it appends to the store it reads: an output of a type it maps would come back
        self.loops = same_store(self.target, runtime.store)

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
                made = 0  # outputs of this input so far: each function's numbered after them
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
                    for i, out in enumerate(outs, start=made):
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
                    made += len(outs)
            if st.lost:  # given up on (a mapping ran past handler_timeout): append nothing
                return Outcome.LOST
            for stream, outs in per_stream.items():
                try:
                    self.target.append(stream, outs)  # its own transaction: at-least-once
                except InvalidInputError:
                    self._name_the_output(outs, made_by[stream])
                    raise
            new_token = advanced(st.token, upto)
            self.commit_token(st, new_token)
        except ClaimLostError:
            return self.lost(st)
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
