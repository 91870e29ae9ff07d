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
from .store import EventStore, open_store

__version__ = "0.1.0"

__all__ = [
    "ClaimLostError",
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
