"""Token stores: where processors keep their progress per segment, with claims."""

from __future__ import annotations

from ..db import Database, open_database
from .base import DEFAULT_CLAIM_TIMEOUT, SegmentStatus, TokenRecord, TokenStore
from .memory import InMemoryTokenStore
from .sql import SQLTokenStore
from .token import Token


def open_token_store(
    url: str | Database, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT
) -> TokenStore:
    """A token store in the database at ``url`` (or an open Database, e.g. ``store.db``)."""
    db = url if isinstance(url, Database) else open_database(url)
    return SQLTokenStore(db, claim_timeout)


__all__ = [
    "DEFAULT_CLAIM_TIMEOUT",
    "InMemoryTokenStore",
    "SQLTokenStore",
    "SegmentStatus",
    "Token",
    "TokenRecord",
    "TokenStore",
    "open_token_store",
]
