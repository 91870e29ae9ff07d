"""Publishers: processors whose one ``on_batch`` handler publishes events to a Kafka topic
(what ``app.publisher`` defines). Each segment batch is published and acknowledged before its
token commits: at least once, every record carrying its event's source chain."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

from ..errors import InvalidInputError
from ..processing.options import ProcessorOptions
from ..processing.processor import Processor
from .sink import KafkaSink, event_records

if TYPE_CHECKING:
    from ..processing.runtime import Runtime


def define_publisher(
    define: Callable[..., Processor],
    runtime: Runtime,
    name: str,
    sink: Any,
    *,
    on: str | list[str] | None = None,
    key: Any = None,
    value: Any = None,
    **options: Unpack[ProcessorOptions],
) -> Processor:
    """Processor ``name`` defined by ``define(name, **options)`` (the App's ``processor``),
    with a handler publishing the batches' events of types ``on`` (all by default) to
    ``sink``: record key ``key(event)`` (default: the stream id), value ``value(event)``
    (default: the event's data), the event type in the ``type`` header and its source chain
    in ``el-source-chain``."""
    if not isinstance(sink, KafkaSink):
        raise InvalidInputError(f"publisher {name!r}: sink must be an el.KafkaSink")
    if options.get("version", 1) != 1:  # as republishers: it would run on history again
        raise InvalidInputError(
            f"publisher {name!r}: a second version of a publisher would publish all of "
            "history again (what version 1 handled is a replay it publishes): define a "
            "publisher of another name"
        )
    for what, fn in (("key", key), ("value", value)):
        if fn is not None and not callable(fn):
            raise InvalidInputError(f"publisher {name!r}: {what}= must be a function")
    types = [on] if isinstance(on, str) else list(on or [])
    proc = define(name, **options)

    @proc.on_batch(*types)
    def publish(events: list[Any], ctx: Any) -> None:
        sink.publish(event_records(events, runtime.store.events_table, key, value))

    return proc
