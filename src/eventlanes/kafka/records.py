"""From a Kafka record to an event: its stream, type, data and metadata, or why it is bad.

* stream: the record key as UTF-8 text, or what ``stream(record)`` returns;
* type: a fixed name, the ``type`` header, or what ``type(record)`` returns;
* data: ``decode(value)``, JSON by default; it must give a JSON object;
* metadata: ``kafka`` (topic, partition, offset, timestamp), ``headers`` (UTF-8 text; a
  repeated header gives a list), and ``source_chain``, whose root is the record's coordinates
  ``(topic, partition, offset)``, or, for a record an eventlanes sink published, the chain it
  carried in its ``el-source-chain`` header with this hop added: an aggregation downstream
  dedupes on the root and drops what a crash made the sink publish twice. The header is an
  input, not a fact (a forged root would make genuine inputs drop as duplicates): it is
  carried only when the ingestor trusts its root source (``trust_chains``), every hop checked
  (:func:`chain_of`); and the record's
  ``traceparent`` (and ``tracestate``) header when valid, as the event's own trace keys, so
  handlers downstream link to the span that published the record (unless ``trace=False``: a
  store with ``trace=off``).

A record that cannot become an event raises :class:`BadRecord` with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..events import NewEvent, NotExact, exact_json
from ..lineage import CHAIN_KEY, MAX_HOPS, check_chain
from ..tracing.propagation import header_fields

CHAIN_HEADER = "el-source-chain"
TYPE_HEADER = "type"
DEFAULT_MAX_BYTES = 1_048_576
#: a chain header's bytes at most: MAX_HOPS hops with long names fit in it; checked before the
#: header is parsed, so no depth of nesting reaches the JSON parser's recursion
MAX_CHAIN_BYTES = 65_536
#: trust_chains: None (not said: a record carrying a chain is bad), False (chains ignored), or
#: the names of the root sources whose chains are carried
Trust = tuple[str, ...] | Literal[False] | None


class BadRecord(Exception):
    """A record that cannot be appended: not JSON, no key where the stream needs one, ..."""

    def __init__(self, reason: str, stream: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stream = stream  # its stream when known, so later records of it wait behind it


@dataclass(frozen=True, slots=True)
class Record:
    """What user functions (``stream=``, ``type=``, ``decode=``) get of a Kafka record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None  # epoch ms, None when the broker gave none

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None if absent)."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @classmethod
    def of(cls, message: Any) -> Record:
        kind, ts = message.timestamp()
        headers = tuple(message.headers() or ())
        return cls(message.topic(), message.partition(), message.offset(), message.key(),
                   message.value(), headers, ts if kind else None)  # fmt: skip


def json_object(value: bytes | None) -> dict[str, Any]:
    """The default decoder: the value must be a JSON object the store can keep (no NaN or
    infinity; no NUL character or lone surrogate, which JSON can only write escaped)."""
    if value is None:
        raise ValueError("the value is empty (a tombstone)")
    data = _DECODER.decode(value.decode(json.detect_encoding(value), "surrogatepass"))
    if not isinstance(data, dict):
        raise ValueError(f"the value is JSON {type(data).__name__}, not an object")
    if b"\\u" in value:  # an escaped character: checked as the store checks it
        exact_json(data)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON-serialisable (JSON has no NaN or infinity)")


#: json.loads with an option builds a decoder per call: one, built once
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def key_stream(record: Record) -> str:
    """The default stream: the record key as UTF-8 text."""
    if record.key is None:
        raise BadRecord("the record has no key (the stream is the key: pass stream=)")
    try:
        return record.key.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("the record key is not UTF-8 text (pass stream=)") from None


def header_type(record: Record) -> str:
    """The default type: the ``type`` header."""
    raw = record.header(TYPE_HEADER)
    if raw is None:
        raise BadRecord("the record has no 'type' header (pass type='Name' or a function)")
    return raw.decode("utf-8", errors="strict")


class _Fixed:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, record: Record) -> str:
        return self.name


class Converter:
    """Turns records into events with the ingestor's functions."""

    def __init__(
        self,
        topic: str,
        stream: Callable[[Record], str] | None,
        type_: str | Callable[[Record], str] | None,
        decode: Callable[[bytes | None], Any] | None,
        max_bytes: int,
        trust: Trust = None,
        own_source: str | Callable[[], str] | None = None,
        roots: Callable[[str, str, int], str | None] | None = None,
    ) -> None:
        self.topic = topic
        self.trust = trust
        self.roots = roots  # (source, partition, offset) -> why a root is refused, or None
        self._own_source = own_source  # the store's events: resolved when first needed
        self.stream_of = stream or key_stream
        self.type_of: Callable[[Record], str] = (
            _Fixed(type_) if isinstance(type_, str) else (type_ or header_type)
        )
        self.decode = decode or json_object
        self.max_bytes = max_bytes

    def stream(self, record: Record) -> str:
        try:
            stream = self.stream_of(record)
        except BadRecord:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's function: the record is bad
            raise BadRecord(f"stream() failed: {_describe(exc)}") from None
        if not isinstance(stream, str) or not stream.strip():
            raise BadRecord(f"stream() gave {stream!r}, not a non-empty string")
        return stream

    def event(self, record: Record, stream: str, trace: bool = True) -> NewEvent:
        size = len(record.value or b"") + len(record.key or b"")
        if size > self.max_bytes:
            raise BadRecord(f"the record has {size:,} bytes, more than max_record_bytes "
                            f"{self.max_bytes:,}", stream)  # fmt: skip
        try:
            type_ = self.type_of(record)
        except BadRecord as exc:
            raise BadRecord(exc.reason, stream) from None
        except Exception as exc:  # noqa: BLE001
            raise BadRecord(f"type() failed: {_describe(exc)}", stream) from None
        if not isinstance(type_, str) or not type_:
            raise BadRecord(f"the event type is {type_!r}, not a non-empty string", stream)
        try:
            data = self.decode(record.value)
        except Exception as exc:  # noqa: BLE001
            raise BadRecord(f"the value cannot be decoded: {_describe(exc)}", stream) from None
        if not isinstance(data, dict):
            raise BadRecord(f"decode() gave {type(data).__name__}, not a dict", stream)
        if self.decode is not json_object:  # what the store refuses: a bad record, here
            try:
                exact_json(data)
            except NotExact as exc:
                raise BadRecord(f"decode() gave what cannot be stored: {exc}", stream) from None
        return NewEvent(type_, data, self.metadata(record, stream, trace))

    def own_source(self) -> str | None:
        if callable(self._own_source):
            self._own_source = self._own_source()
        return self._own_source

    def chain_of(self, raws: list[bytes | None], stream: str) -> list[Any]:
        """The chain of ``el-source-chain`` header values ``raws``, if it may be carried on;
        BadRecord otherwise. Never an exception of another kind: whatever a header holds, the
        record is bad, not the ingestor dead."""

        def bad(why: str) -> BadRecord:
            return BadRecord(f"header {CHAIN_HEADER!r} {why}", stream)

        if self.trust is None:
            raise bad("carries lineage this ingestor was not told to trust: pass "
                      "trust_chains=[the upstream sources] to carry it on, or "
                      "trust_chains=False to ignore it")  # fmt: skip
        assert self.trust is not False
        if len(raws) > 1:
            raise bad(f"is given {len(raws)} times")
        raw = raws[0] or b""
        if len(raw) > MAX_CHAIN_BYTES:
            raise bad(f"has {len(raw):,} bytes, more than {MAX_CHAIN_BYTES:,}")
        try:
            chain = check_chain(json.loads(raw))
        except RecursionError:
            raise bad(f"is nested too deep (a chain has at most {MAX_HOPS} hops)") from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError included
            raise bad(f"is malformed: {exc}") from None
        source = chain[0]["source"]
        if source == self.topic:
            raise bad(f"names the ingested topic {source!r} as its root: a record cannot "
                      "descend from its own topic")  # fmt: skip
        own = self.own_source()
        if own is not None and source == own:
            raise bad(
                f"names this store's own events ({source!r}) as its root (a store "
                "upstream with the same table names? give one of them another prefix=)"
            )
        if source not in self.trust and source.split(":", 1)[0] not in self.trust:
            raise bad(f"root source {source!r} is not one of trust_chains {list(self.trust)}")
        if self.roots is not None:
            why = self.roots(source, chain[0]["partition"], chain[0]["offset"])
            if why is not None:
                raise bad(why)
        return chain

    def metadata(self, record: Record, stream: str, trace: bool = True) -> dict[str, Any]:
        headers: dict[str, Any] = {}
        chain: list[Any] = []
        raws = [raw for key, raw in record.headers if key == CHAIN_HEADER]
        if raws and self.trust is not False:
            chain = self.chain_of(raws, stream)
        for key, raw in record.headers:
            if key == CHAIN_HEADER:
                continue
            try:
                value = None if raw is None else raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRecord(f"header {key!r} is not UTF-8 text", stream) from None
            if key in headers:
                old = headers[key]
                headers[key] = [*old, value] if isinstance(old, list) else [old, value]
            else:
                headers[key] = value
        hop = {"source": self.topic, "partition": str(record.partition), "offset": record.offset,
               "out": 0}  # fmt: skip
        meta: dict[str, Any] = {
            CHAIN_KEY: [*chain, hop],
            "kafka": {"topic": record.topic, "partition": record.partition,
                      "offset": record.offset, "timestamp": record.timestamp},
        }  # fmt: skip
        if headers:
            meta["headers"] = headers
            if trace:
                meta.update(header_fields(record.headers))
        return meta


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
