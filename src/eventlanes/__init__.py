"""eventlanes: parallel, per-key ordered, resumable, exactly-once event processing."""

from __future__ import annotations

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

__version__ = "0.1.0"

__all__ = [
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


def __getattr__(name: str):  # noqa: ANN202 - lazy: Spark is an optional extra
    if name == "spark":
        import importlib

        return importlib.import_module(".spark", __name__)
    raise AttributeError(f"module 'eventlanes' has no attribute {name!r}")
