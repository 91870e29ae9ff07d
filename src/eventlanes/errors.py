"""Exceptions raised by eventlanes. Every error names what was wrong."""

from __future__ import annotations


class EventlanesError(Exception):
    """Base class of every eventlanes error."""


class InvalidInputError(EventlanesError, ValueError):
    """Input rejected before anything was written (bad stream id, non-JSON data, bad name...)."""


class StoreConnectionError(EventlanesError):
    """The store URL could not be opened or connected to."""


class SchemaError(StoreConnectionError):
    """The store's tables are missing, older or newer than this eventlanes, or the role may not
    use them: the message names the store (password hidden), the versions and what to run
    (``eventlanes migrate URL`` with a role that may create and alter the tables)."""


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


class ProcessorBusyError(EventlanesError):
    """The operation needs every segment, and a live node holds one."""


class BackpressureError(EventlanesError):
    """The in-flight window is full: the reader must stop reading until lanes catch up."""


class HandlerTimeoutError(EventlanesError):
    """A handler ran longer than the timeout; left alone it would stall commits forever."""


class StopTimeoutError(EventlanesError):
    """A processor did not stop within its grace period (a handler still runs); its claims are
    left to expire, so another node continues from the stored tokens."""


class ProcessorCrashedError(EventlanesError):
    """A processor's runner was stopped by an exception it could not handle as a failed batch
    (a handler raising ``KeyboardInterrupt`` or ``SystemExit``, a bug): the batch in hand was
    rolled back, the error recorded on its segments (``status`` shows it), and the other
    processors stopped. The exception is chained as ``__cause__``."""

    def __init__(self, processor: str, text: str) -> None:
        self.processor = processor
        super().__init__(f"processor {processor!r} crashed: {text}")


class VersionError(EventlanesError):
    """A version of a processor could not be promoted or retired (the message says why: not
    caught up, still serving, still running...), or a retired one was to run again."""


class ProcessorPausedError(ClaimLostError):
    """The processor is paused: its owners must let their claims go until it is resumed."""


class DatabaseUnavailableError(StoreConnectionError):
    """The database failed in a way that retrying later may cure: connection lost or refused,
    server restarting, pool timeout, SQLite busy past its timeout, disk full. ``operation``
    names what was being done (``"append to stream 'x'"``, ``"head"``...)."""

    def __init__(self, operation: str, cause: str) -> None:
        self.operation = operation
        self.cause = cause
        super().__init__(f"{operation} failed, the database is unavailable: {cause}")


class CorruptEventError(EventlanesError):
    """A stored event cannot be decoded (invalid UTF-8, data or metadata that is not a JSON
    object). Raised when its ``data``/``metadata`` is accessed; other events of the same read
    are unaffected."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(f"stored event at position {position} is corrupt: {reason}")


class UpcastError(CorruptEventError):
    """An upcaster failed on an event (raised, or returned something that is not the event's
    new data): raised when the event's ``data`` is accessed, as for a corrupt event, so a
    handler fails (or parks) just that event's key; the Spark readers raise it at once. The
    stored event is unchanged: fix the upcaster, and the next read upcasts it again."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        Exception.__init__(self, f"event at position {position} could not be upcast: {reason}")


class CorruptTokenError(InvalidInputError):
    """A stored token row's detail (``token_detail``) cannot be decoded: the message names the
    processor and the segment. A runner stops that segment with this error (retried with
    back-off like a failed batch, never skipping the token) and runs the others; fix or reset
    the row."""

    def __init__(self, processor: str, segment: str, reason: str) -> None:
        self.processor = processor
        self.segment = segment
        self.reason = reason
        super().__init__(
            f"processor {processor!r}: the token of segment {segment} is corrupt: {reason}"
        )


class SparkJobError(EventlanesError):
    """A Spark job could not run, or read other data than the store holds (executors missing
    code, a replay that read fewer or more events than the store has)."""


class DeltaWriteError(EventlanesError):
    """A Delta table a replay may not write (another store's), or a write that stopped: the
    table and the store are left as they were."""


class FieldTypeError(InvalidInputError):
    """An event's property does not have the type a declarative aggregation declared for it
    (raised while folding, naming the event)."""
