"""Parked records: bad records (and the later records of their stream) as dead letters.

They go into the processors' dead-letter table (``processing/dead_letters.py``), under the
ingestor's name, in the transaction of the batch and its token: ``position`` packs the
partition and offset (``partitions.pack``), ``version`` is the offset, ``seq_key`` and
``stream_id`` the stream when known. The record itself stays on the broker: a retry fetches
it again by its offset and appends it with the ingestor's (perhaps fixed) functions, in
offset order per stream, each stream in one transaction with the deletion of its letters.
So ``eventlanes dead-letters APP INGESTOR [--retry | --discard]`` works as for processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError
from ..hashing import stable_hash
from ..processing.tables.dead_letters import DeadLetter
from . import client
from .partitions import pack, unpack
from .records import BadRecord, Record

if TYPE_CHECKING:
    from ..processing.runtime import Runtime
    from .ingestor import Ingestor

RECORD_TYPE = "kafka-record"


@dataclass(frozen=True, slots=True)
class ParkedRecord:
    """One parked record: its coordinates, stream (when known) and why."""

    ingestor: str
    partition: int
    offset: int
    stream: str | None
    error: str
    attempts: int
    parked_at: float

    @classmethod
    def of(cls, letter: DeadLetter) -> ParkedRecord:
        partition, offset = unpack(letter.position)
        return cls(letter.processor, partition, offset, letter.seq_key, letter.error,
                   letter.attempts, letter.parked_at)  # fmt: skip

    @property
    def position(self) -> int:
        return pack(self.partition, self.offset)


def park(rt: Runtime, conn: Any, ingestor: str, record: Record, stream: str | None,
         error: str) -> None:  # fmt: skip
    letters = rt.dead_letters
    conn.execute(
        letters.db.sql(
            f"""INSERT INTO {letters.table} (processor, position, seq_key, routing_hash,
                stream_id, version, event_type, error, parked_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, {letters.db.now_ms})"""
        ),
        (ingestor, pack(record.partition, record.offset), stream,
         stable_hash(stream) if stream else 0, stream or "", record.offset, RECORD_TYPE,
         f"partition {record.partition} offset {record.offset}: {error}"[:4000]),
    )  # fmt: skip


def parked_streams(rt: Runtime, ingestor: str) -> set[str]:
    return {key for key, _ in rt.dead_letters.parked_keys(ingestor)}


def listed(rt: Runtime, ing: Ingestor, stream: str | None = None,
           position: int | None = None) -> list[ParkedRecord]:  # fmt: skip
    return [ParkedRecord.of(d) for d in rt.dead_letters.list(ing.name, stream, position)]


def discard(rt: Runtime, ing: Ingestor, stream: str | None = None,
            position: int | None = None) -> int:  # fmt: skip
    records = listed(rt, ing, stream, position)
    with rt.db.transaction() as conn:
        rt.dead_letters.delete(conn, ing.name, [r.position for r in records])
    return len(records)


def retry(rt: Runtime, ing: Ingestor, stream: str | None = None,
          position: int | None = None) -> tuple[int, int]:  # fmt: skip
    """Fetch the parked records again and append them, per stream in offset order, each
    stream in one transaction with the deletion of its letters. Returns (appended, still
    parked). Retrying one record of a stream with earlier parked records is refused."""
    records = listed(rt, ing, stream, position)
    if position is not None and records and records[0].stream is not None:
        first = listed(rt, ing, records[0].stream)[0]
        if (first.partition, first.offset) < (records[0].partition, records[0].offset):
            raise InvalidInputError(
                f"parked record {position} (partition {records[0].partition} offset "
                f"{records[0].offset}) waits behind offset {first.offset} of the same stream "
                f"{first.stream!r}: retry that one first, or the whole stream"
            )
    groups: dict[str, list[ParkedRecord]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        groups.setdefault(r.stream or f"#{r.position}", []).append(r)
    fetched = _fetch(ing, [(r.partition, r.offset) for r in records])
    appended = 0
    for group in groups.values():
        try:
            events = []
            for r in group:
                message = fetched.get((r.partition, r.offset))
                if message is None:
                    raise BadRecord(f"the broker no longer has offset {r.offset} of partition "
                                    f"{r.partition} (retention?): discard it")  # fmt: skip
                record = Record.of(message)
                s = ing.converter.stream(record)
                events.append((s, ing.converter.event(record, s, rt.store.trace_context)))
        except BadRecord as exc:
            rt.dead_letters.record_failure(
                ing.name, group[0].position,
                f"partition {group[0].partition} offset {group[0].offset}: {exc.reason}",
            )  # fmt: skip
            continue
        with rt.db.transaction() as conn:
            for s, event in events:
                rt.store.append(s, [event], conn=conn)
            rt.dead_letters.delete(conn, ing.name, [r.position for r in group])
        appended += len(group)
    return appended, len(records) - appended


def _fetch(ing: Ingestor, wanted: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """The records at these (partition, offset)s, read from the broker."""
    if not wanted:
        return {}
    ck = client.client_module()
    timeout = ing.kafka.timeout
    consumer = client.consumer(ing.kafka)
    found: dict[tuple[int, int], Any] = {}
    try:
        by_partition: dict[int, list[int]] = {}
        for p, o in wanted:
            by_partition.setdefault(p, []).append(o)
        for p, offsets in by_partition.items():
            for offset in sorted(offsets):
                if (p, offset) in found:
                    continue
                consumer.assign([ck.TopicPartition(ing.topic, p, offset)])
                message = _first(consumer, timeout)
                if message is not None and message.offset() == offset:
                    found[p, offset] = message
    finally:
        consumer.close()
    return found


def _first(consumer: Any, timeout: float) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            return None
        return message
    return None
