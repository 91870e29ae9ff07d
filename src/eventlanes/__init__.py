"""eventlanes: parallel, per-key ordered, resumable, exactly-once event processing.

The public names load on first use (PEP 562): ``import eventlanes`` costs next to nothing, so
the ``eventlanes`` command installs its signal handling before the heavy imports, and a
Ctrl-C in its first second stops it quietly instead of printing a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported at once
    from .admin.versions import RetirePlan
    from .admin.views import ProcessorView, SegmentView, VersionView
    from .app import App
    from .errors import (
        BackpressureError,
        ClaimLostError,
        ConcurrencyError,
        CorruptEventError,
        CorruptTokenError,
        DatabaseUnavailableError,
        DeltaWriteError,
        EventlanesError,
        FieldTypeError,
        HandlerTimeoutError,
        InvalidInputError,
        ProcessorBusyError,
        ProcessorCrashedError,
        ProcessorPausedError,
        SchemaError,
        SparkJobError,
        StopTimeoutError,
        StoreConnectionError,
        VersionError,
    )
    from .events import Event, NewEvent
    from .hashing import stable_hash
    from .kafka import Ingestor, Kafka, KafkaSink, KafkaUnavailableError
    from .observe import Observer
    from .policies import (
        SequencingPolicy,
        by_data,
        by_metadata,
        full_concurrency,
        per_stream,
        sequential,
    )
    from .processing.aggregating.aggregation import Aggregation, Stage
    from .processing.aggregating.declarative import count, first, last, max, min, sum
    from .processing.executors.acks import CommitTracker
    from .processing.handlers import disallow_replay
    from .processing.handling.context import Context
    from .processing.options import Guarantee
    from .processing.processor import Processor
    from .processing.republisher import Republisher
    from .processing.tables.dead_letters import DeadLetter
    from .schema import migrate
    from .segments import Segment
    from .store import EventStore, open_store
    from .tokens import (
        InMemoryTokenStore,
        SegmentStatus,
        SQLTokenStore,
        Token,
        TokenRecord,
        TokenStore,
        open_token_store,
    )
    from .windows.kinds import calendar, hopping, session, tumbling
    from .windows.spec import LateEvent, WindowResult
    from .windows.ticks import TICK
    from .windows.time import event_time, recorded_time

__version__ = "0.1.0"

__all__ = [
    "TICK",
    "tumbling",
    "calendar",
    "hopping",
    "session",
    "event_time",
    "recorded_time",
    "LateEvent",
    "WindowResult",
    "count",
    "first",
    "last",
    "max",
    "min",
    "sum",
    "Aggregation",
    "App",
    "BackpressureError",
    "CommitTracker",
    "HandlerTimeoutError",
    "Republisher",
    "Stage",
    "ClaimLostError",
    "Context",
    "DeadLetter",
    "Guarantee",
    "Processor",
    "ProcessorBusyError",
    "ProcessorCrashedError",
    "ProcessorView",
    "RetirePlan",
    "VersionView",
    "Observer",
    "SegmentView",
    "disallow_replay",
    "InMemoryTokenStore",
    "Ingestor",
    "Kafka",
    "KafkaSink",
    "KafkaUnavailableError",
    "SQLTokenStore",
    "Segment",
    "SegmentStatus",
    "SequencingPolicy",
    "Token",
    "TokenRecord",
    "TokenStore",
    "by_data",
    "by_metadata",
    "full_concurrency",
    "open_token_store",
    "per_stream",
    "sequential",
    "ConcurrencyError",
    "CorruptEventError",
    "CorruptTokenError",
    "DatabaseUnavailableError",
    "DeltaWriteError",
    "ProcessorPausedError",
    "SchemaError",
    "FieldTypeError",
    "SparkJobError",
    "Event",
    "EventStore",
    "EventlanesError",
    "InvalidInputError",
    "NewEvent",
    "StopTimeoutError",
    "StoreConnectionError",
    "VersionError",
    "migrate",
    "open_store",
    "stable_hash",
]

#: public name -> the module it lives in (relative to this package)
_HOMES = {
    "RetirePlan": ".admin.versions",
    "ProcessorView": ".admin.views",
    "SegmentView": ".admin.views",
    "VersionView": ".admin.views",
    "App": ".app",
    "BackpressureError": ".errors",
    "ClaimLostError": ".errors",
    "ConcurrencyError": ".errors",
    "CorruptEventError": ".errors",
    "CorruptTokenError": ".errors",
    "DatabaseUnavailableError": ".errors",
    "DeltaWriteError": ".errors",
    "EventlanesError": ".errors",
    "FieldTypeError": ".errors",
    "HandlerTimeoutError": ".errors",
    "InvalidInputError": ".errors",
    "ProcessorBusyError": ".errors",
    "ProcessorCrashedError": ".errors",
    "ProcessorPausedError": ".errors",
    "SchemaError": ".errors",
    "SparkJobError": ".errors",
    "StopTimeoutError": ".errors",
    "StoreConnectionError": ".errors",
    "VersionError": ".errors",
    "Event": ".events",
    "NewEvent": ".events",
    "stable_hash": ".hashing",
    "Ingestor": ".kafka",
    "Kafka": ".kafka",
    "KafkaSink": ".kafka",
    "KafkaUnavailableError": ".kafka",
    "Observer": ".observe",
    "SequencingPolicy": ".policies",
    "by_data": ".policies",
    "by_metadata": ".policies",
    "full_concurrency": ".policies",
    "per_stream": ".policies",
    "sequential": ".policies",
    "Aggregation": ".processing.aggregating.aggregation",
    "Stage": ".processing.aggregating.aggregation",
    "count": ".processing.aggregating.declarative",
    "first": ".processing.aggregating.declarative",
    "last": ".processing.aggregating.declarative",
    "max": ".processing.aggregating.declarative",
    "min": ".processing.aggregating.declarative",
    "sum": ".processing.aggregating.declarative",
    "CommitTracker": ".processing.executors.acks",
    "disallow_replay": ".processing.handlers",
    "Context": ".processing.handling.context",
    "Guarantee": ".processing.options",
    "Processor": ".processing.processor",
    "Republisher": ".processing.republisher",
    "DeadLetter": ".processing.tables.dead_letters",
    "migrate": ".schema",
    "Segment": ".segments",
    "EventStore": ".store",
    "open_store": ".store",
    "InMemoryTokenStore": ".tokens",
    "SQLTokenStore": ".tokens",
    "SegmentStatus": ".tokens",
    "Token": ".tokens",
    "TokenRecord": ".tokens",
    "TokenStore": ".tokens",
    "open_token_store": ".tokens",
    "calendar": ".windows.kinds",
    "hopping": ".windows.kinds",
    "session": ".windows.kinds",
    "tumbling": ".windows.kinds",
    "LateEvent": ".windows.spec",
    "WindowResult": ".windows.spec",
    "TICK": ".windows.ticks",
    "event_time": ".windows.time",
    "recorded_time": ".windows.time",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value
    # A submodule reached as an attribute (``el.spark``, ``el.kafka``): that one alone. The
    # import system asks here too (``from eventlanes import signals``, before it imports
    # the module itself), so nothing else may load on the way: the command's entry imports
    # its signal handling so, first.
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'eventlanes' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "spark"})
