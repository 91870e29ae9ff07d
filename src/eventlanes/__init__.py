"""eventlanes: parallel, per-key ordered, resumable, exactly-once event processing."""

from __future__ import annotations

from .errors import (
    ClaimLostError,
    ConcurrencyError,
    EventlanesError,
    InvalidInputError,
    StoreConnectionError,
)
from .events import Event, NewEvent
from .hashing import stable_hash
from .policies import (
    SequencingPolicy,
    by_data,
    by_metadata,
    full_concurrency,
    per_stream,
    sequential,
)
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
    "ClaimLostError",
    "InMemoryTokenStore",
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
    "Event",
    "EventStore",
    "EventlanesError",
    "InvalidInputError",
    "NewEvent",
    "StoreConnectionError",
    "open_store",
    "stable_hash",
]
