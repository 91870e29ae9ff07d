"""Exceptions raised by eventlanes. Every error names what was wrong."""

from __future__ import annotations


class EventlanesError(Exception):
    """Base class of every eventlanes error."""


class InvalidInputError(EventlanesError, ValueError):
    """Input rejected before anything was written (bad stream id, non-JSON data, bad name...)."""


class StoreConnectionError(EventlanesError):
    """The store URL could not be opened or connected to."""


class ConcurrencyError(EventlanesError):
    """An append's expected version did not match the stream's actual version."""

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"stream {stream_id!r}: expected version {expected}, actual version {actual}"
        )


class ClaimLostError(EventlanesError):
    """A token write was refused because another owner holds (or stole) the claim."""


class SparkJobError(EventlanesError):
    """A Spark job could not run, or read other data than the store holds (executors missing
    code, a replay that read fewer or more events than the store has)."""
