"""The ingest runner: one thread per ingestor and process, appending a topic's records to the
store exactly once.

Each round it (1) coordinates, about every second: finds the topic's partitions (new ones get
token rows, at the earliest offset unless ``initial="latest"``), claims its fair share through
the token store (heartbeat, timeout, steal, hold-off: as segments), checks each newly claimed
partition against the broker, and records the watermarks it fetched; (2) reads what the
broker has for its partitions, from each partition's token; (3) appends it: per partition in
offset order (a partition after another, or with ``order="time"`` interleaved by timestamp:
:mod:`.interleave`), runs of one stream each (``append_runs``), all in one transaction with
the partitions' tokens (the next offset), fenced by their claims. A crash anywhere rolls back
both or neither: nothing lost, nothing doubled.

The consumer is rebuilt from the tokens whenever the claimed partitions change or a round
fails, so it never holds data read for an older position. No consumer group is joined and
nothing is committed to the broker: the tokens are the offsets.

Never a silent jump: a partition whose token is below the broker's first offset (retention
passed it) or above its high watermark (the topic was recreated), or whose topic id changed
while it had been read, fails with both offsets named; so does a bad record when
``on_bad="stop"``. A failed partition is released with back-off (1 s doubling to 60 s) and
retried on any node; the reason shows in ``status``. Broker and database outages are
weather: the runner logs once, waits (1 s doubling to 30 s), and goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..db import weather
from ..errors import ClaimLostError, InvalidInputError
from ..signals import join
from ..tokens import SegmentStatus, SQLTokenStore, Token
from ..tokens.claims import HOLD_OFF_ROUNDS, Heartbeat, claimable, fair_share
from ..tracing import propagation, spans
from . import client, parking
from .interleave import TimeOrder
from .partitions import PartitionTable, segment
from .records import BadRecord, Record
from .settings import KafkaUnavailableError

if TYPE_CHECKING:
    from ..processing.runtime import Runtime
    from .ingestor import Ingestor

log = logging.getLogger("eventlanes.kafka")

#: seconds a read waits for the first record; the rest of a batch is what is already there
POLL_WAIT = 0.1


@dataclass(eq=False)
class Claimed:
    """A partition this process holds: the next offset to append (its token)."""

    partition: int
    next: int
    lost: bool = False
    #: when this process took it (monotonic): an extension that began before cannot know it
    claimed_at: float = field(default_factory=time.monotonic)


class Stop(Exception):  # noqa: N818 - not an error of the runner: the partition stops
    """A partition must stop: recorded as its failure, released with back-off."""


class IngestRunner:
    def __init__(self, runtime: Runtime, ingestor: Ingestor, owner: str) -> None:
        self.rt = runtime
        self.ing = ingestor
        self.name = ingestor.name
        self.owner = owner
        self.tokens = runtime.tokens
        self.claimed: dict[int, Claimed] = {}
        self.lock = threading.Lock()  # ``claimed`` against the heartbeat
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.interval = min(1.0, runtime.claim_timeout / 3)
        self.timeout = ingestor.kafka.timeout
        self._thread = threading.Thread(target=self._run, name=f"eventlanes-{self.name}",
                                        daemon=True)  # fmt: skip
        self._consumer: Any = None
        self._admin: Any = None
        self._rebuild = True
        self._next_round = 0.0
        self._known: set[int] = set()
        self._parked: set[str] = set()
        self._marks: dict[int, tuple[int, int]] = {}  # watermarks recorded last
        self._topic_id: str | None = None
        self._outage: str | None = None  # what is down, while it is
        self._backoff = weather.Backoff()
        self.table: PartitionTable | None = None
        self.heartbeat = Heartbeat(self.tokens, self.name, owner, on_held=self._held)
        self._time_order = TimeOrder() if ingestor.order == "time" else None
        self._paused: set[int] = set()  # partitions paused while their buffers are full

    # -- starting and stopping -----------------------------------------------------------------
    def check(self) -> None:
        """Before starting: the token store shares the store's database (so an append and its
        token commit together) and the broker answers with the topic, within the timeout."""
        if not isinstance(self.tokens, SQLTokenStore) or self.tokens.db is not self.rt.db:
            raise InvalidInputError(
                f"ingestor {self.name!r} needs the token store in the event store's database "
                "(the default): its tokens commit with the appends"
            )
        own = self.rt.store.events_table
        if self.ing.trust_chains and own in self.ing.trust_chains:
            raise InvalidInputError(
                f"ingestor {self.name!r}: trust_chains names this store's own events ({own!r}): "
                "a record from outside cannot be the root of what the store itself holds (a "
                "store upstream with the same table names? give one of them another prefix=)"
            )
        self.table = PartitionTable(self.rt.db)
        _ = self.rt.dead_letters  # its table exists before the first record is parked
        self._admin = client.admin(self.ing.kafka)
        client.describe(self.ing.kafka, self.ing.topic, self._admin, self.timeout)

    def start(self) -> None:
        if self.table is None:
            self.check()
        log.info("%s: ingesting topic %s from %s (on_bad=%s, trust_chains=%s)", self.name,
                 self.ing.topic, self.ing.kafka.bootstrap_servers, self.ing.on_bad,
                 self.ing.trust_chains)  # fmt: skip
        self.heartbeat.start()
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self.stopping.set()
        join(self._thread, timeout)  # in slices: a second signal acts at once
        return not self._thread.is_alive()

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._round()
                    self._backoff.reset()
                except ClaimLostError as exc:
                    log.info("%s: %s; coordinating again", self.name, exc)
                    self._rebuild = True
                    self._next_round = 0.0
                except Exception as exc:
                    if not (weather.is_transient(exc) or client.is_transient(exc)):
                        raise
                    delay = self._backoff.next()
                    log.warning("%s: %s; retrying in %.0f s", self.name, exc, delay)
                    self._rebuild = True
                    self._next_round = 0.0
                    self.stopping.wait(delay)
        except BaseException as exc:
            self.error = exc
            log.error("%s: stopped: %s", self.name, exc, exc_info=exc)
            self.stopping.set()
        finally:
            self._shutdown()

    def _round(self) -> None:
        if time.monotonic() >= self._next_round:
            self._coordinate()
            self._next_round = time.monotonic() + self.interval
        if self._rebuild:
            self._assign()
            if self._time_order is not None:
                self._time_order.reset()  # the new consumer reads from the tokens again
                self._paused = set()
        if not self.claimed or self._consumer is None:
            self.stopping.wait(0.1)
            return
        messages = self._read()
        batch: dict[int, list[Any]] = {}
        for m in messages:
            err = m.error()
            if err is not None:
                if self._time_order is not None and err.code() == client.PARTITION_EOF:
                    self._time_order.at_end(m.partition(), m.offset())  # nothing more yet
                    continue
                self._client_error(m, err)
                continue
            held = self.claimed.get(m.partition())
            if held is None or held.lost or m.offset() < held.next:
                continue  # not ours (any more), or appended already
            batch.setdefault(m.partition(), []).append(m)
        order = None
        if self._time_order is not None:
            self._time_order.add(batch)
            batch, order = self._time_order.take(sorted(self.claimed), self._live,
                                                 self.ing.batch_size)  # fmt: skip
            self._pace()
        if batch:
            self._commit(batch, order)
        if self._outage and messages:
            log.info("%s: the broker answers again (%s is over)", self.name, self._outage)
            self._outage = None

    def _read(self) -> list[Any]:
        first = self._consumer.poll(POLL_WAIT)
        if first is None:
            return []
        more = self._consumer.consume(self.ing.batch_size - 1, timeout=0) if (
            self.ing.batch_size > 1) else []  # fmt: skip
        return [first, *more]

    # -- appending -----------------------------------------------------------------------------
    def _pace(self) -> None:
        """Pause the partitions whose buffers are full, resume those with room again."""
        assert self._time_order is not None
        full, room = self._time_order.pacing(self._paused)
        ck = client.client_module()
        if full:
            self._consumer.pause([ck.TopicPartition(self.ing.topic, p) for p in full])
        if room:
            self._consumer.resume([ck.TopicPartition(self.ing.topic, p) for p in room])
        self._paused = (self._paused | set(full)) - set(room)

    def _live(self, p: int) -> bool:
        """Partition ``p`` has records on the broker this process has not read (or its high
        watermark is not known yet)."""
        ck = client.client_module()
        _, high = self._consumer.get_watermark_offsets(
            ck.TopicPartition(self.ing.topic, p), cached=True
        )
        held = self.claimed.get(p)
        if held is None or held.lost:
            return False
        return high < 0 or high > self._time_order.next_offset(p, held.next)  # type: ignore[union-attr]

    def _commit(
        self, batch: dict[int, list[Any]], order: list[tuple[int, int]] | None = None
    ) -> None:
        """Append ``batch``; when tracing is on, in a span ``ingest {name}`` linked to the
        spans that published its records (their ``traceparent`` headers)."""
        tracer = spans.tracer()
        if tracer is None:
            return self._append(batch, order)
        base = spans.base_attributes(self.name, guarantee="exactly-once")
        base.update({spans.SYSTEM: "kafka", spans.INGESTOR: self.name,
                     spans.DESTINATION: self.ing.topic})  # fmt: skip
        count = sum(len(messages) for messages in batch.values())
        with spans.batch(tracer, "ingest", base, count=count,
                         extra={"eventlanes.partitions": sorted(batch)}) as span:  # fmt: skip
            if span.is_recording():
                seen: set[tuple[int, int]] = set()
                for p, messages in sorted(batch.items()):
                    for m in messages:
                        ctx = propagation.context_of(
                            propagation.header_fields(m.headers() or ()) or None
                        )
                        if ctx is not None and (ctx.trace_id, ctx.span_id) not in seen:
                            seen.add((ctx.trace_id, ctx.span_id))
                            span.add_link(ctx, {spans.PARTITION_ID: str(p),
                                                spans.KAFKA_OFFSET: m.offset()})  # fmt: skip
            self._append(batch, order)

    def _append(
        self, batch: dict[int, list[Any]], order: list[tuple[int, int]] | None = None
    ) -> None:
        rt = self.rt
        parked = set(self._parked)
        stops: list[tuple[int, str]] = []
        advanced: dict[int, int] = {}
        counts: dict[int, tuple[int, int]] = {}
        started = time.perf_counter()
        # PostgreSQL: pipeline mode, so each append's NOTIFY costs no round trip of its own
        with rt.db.transaction(pipeline=True) as conn:
            converted: dict[int, dict[int, tuple[str, Any]]] = {}
            for p, messages in sorted(batch.items()):
                events, nxt, n_parked = self._convert(conn, p, messages, parked, stops)
                converted[p] = events
                if nxt != self.claimed[p].next:
                    self.tokens.store(self.name, p, Token(nxt), self.owner, conn=conn)
                    advanced[p] = nxt
                counts[p] = (len(events), n_parked)
            if order is None:  # a partition after another
                order = [(p, offset) for p in sorted(converted) for offset in converted[p]]
            runs: list[tuple[str, list[Any]]] = []
            for p, offset in order:
                if (found := converted[p].get(offset)) is None:
                    continue  # parked, or after a bad record that stops its partition
                stream, event = found
                if runs and runs[-1][0] == stream:
                    runs[-1][1].append(event)
                else:
                    runs.append((stream, [event]))
            if runs:
                rt.store.append_runs(runs, conn=conn)
        seconds = time.perf_counter() - started
        self._parked = parked
        obs = rt.observer
        for p, nxt in advanced.items():
            self.claimed[p].next = nxt
            appended, n_parked = counts[p]
            obs.batch_handled(self.name, str(p), appended, 0.0)
            obs.committed(self.name, str(p), seconds)
            if n_parked:
                obs.parked(self.name, str(p), n_parked)
                log.warning("%s: parked %d record(s) of partition %d", self.name, n_parked, p)
        if advanced:
            rt.progress.advanced()
        for p, reason in stops:
            self._fail(p, reason)

    def _convert(
        self, conn: Any, p: int, messages: list[Any], parked: set[str],
        stops: list[tuple[int, str]],
    ) -> tuple[dict[int, tuple[str, Any]], int, int]:  # fmt: skip
        """Partition ``p``'s records as (stream, event) by offset, up to a bad record that
        stops it (``on_bad="stop"``, added to ``stops``) or with the bad ones parked; the next
        offset, and how many were parked."""
        ing, conv = self.ing, self.ing.converter
        trace = self.rt.store.trace_context
        events: dict[int, tuple[str, Any]] = {}
        n_parked = 0
        nxt = self.claimed[p].next
        for m in messages:
            record = Record.of(m)
            try:
                stream = conv.stream(record)
                if ing.on_bad == "dead_letter" and stream in parked:
                    raise BadRecord(f"waits behind an earlier parked record of stream "
                                    f"{stream!r}", stream)  # fmt: skip
                event = conv.event(record, stream, trace)
            except BadRecord as bad:
                if ing.on_bad == "stop":
                    stops.append((p, f"record at offset {record.offset} of partition "
                                     f"{p} is bad: {bad.reason}"))  # fmt: skip
                    break
                parking.park(self.rt, conn, self.name, record, bad.stream, bad.reason)
                if bad.stream is not None:
                    parked.add(bad.stream)
                n_parked += 1
                nxt = record.offset + 1
                continue
            events[record.offset] = (stream, event)
            nxt = record.offset + 1
        return events, nxt, n_parked

    # -- coordinating --------------------------------------------------------------------------
    def _coordinate(self) -> None:
        try:
            self._discover()
        except (KafkaUnavailableError, client.TopicMissingError) as exc:
            self._down(str(exc))  # the partitions known go on; their checks stop what is wrong
        rows = {s.segment.id: s for s in self.tokens.status(self.name)}
        if any(s.paused for s in rows.values()):
            self._let_go("paused")
            return
        for p, held in list(self.claimed.items()):
            row = rows.get(p)
            if held.lost or row is None or row.owner != self.owner:
                self._forget(p)
            elif row.position != held.next:  # the row is the truth: a commit whose answer
                log.warning(  # was lost (a failed round) had been appended all the same
                    "%s: partition %d: its token is at offset %d, not %d (a commit whose "
                    "answer was lost); reading on from the token", self.name, p, row.position,
                    held.next,
                )  # fmt: skip
                held.next = row.position
                self._rebuild = True
        self._claim(rows)
        self.rt.observer.claims(self.name, len(self.claimed))
        if self.ing.on_bad == "dead_letter":
            self._parked = parking.parked_streams(self.rt, self.name)
        self._check_marks()

    def _discover(self) -> None:
        info = client.describe(self.ing.kafka, self.ing.topic, self._admin, self.timeout)
        self._topic_id = client.topic_id(self.ing.kafka, self.ing.topic, self._admin,
                                         self.timeout)  # fmt: skip
        new = [p for p in info.partitions if p not in self._known]
        if not new:
            return
        assert self.table is not None
        self.table.add(self.name, self.ing.topic, new, self._topic_id)
        have = {s.segment.id for s in self.tokens.status(self.name)}
        missing = [p for p in new if p not in have]
        if missing:
            probe = self._consumer or client.consumer(self.ing.kafka)
            try:
                rows = [(segment(p), self._initial(probe, p)) for p in missing]
            finally:
                if probe is not self._consumer:
                    probe.close()
            created = self.tokens.add_segments(self.name, rows)
            starts = {s.id: pos for s, pos in rows}
            for seg in created:
                log.info("%s: partition %d of %s found; starts at offset %d", self.name,
                         seg.id, self.ing.topic, starts[seg.id])  # fmt: skip
        self._known.update(new)

    def _initial(self, consumer: Any, partition: int) -> int:
        if self.ing.initial == "latest":
            return client.latest_offset(consumer, self.ing.topic, partition, self.timeout)
        return max(0, client.low_watermark(consumer, self.ing.topic, partition, self.timeout))

    def _claim(self, rows: dict[int, SegmentStatus]) -> None:
        live = len(self.tokens.live_nodes(self.name))
        limit, surplus = fair_share(len(rows), live, self.ing.max_partitions, self.claimed)
        for p in surplus:  # leave the surplus to nodes that wait for it
            self._forget(p)
            self.tokens.release(self.name, p, self.owner, hold_off=self.interval * HOLD_OFF_ROUNDS)
        for p in sorted(rows):
            if len(self.claimed) >= limit:
                break
            if p in self.claimed or not claimable(rows[p], self.owner):
                continue
            record = self.tokens.claim(self.name, p, self.owner)
            if record is None:
                continue
            held = Claimed(p, record.token.position)
            try:
                self._check_claimed(held)
            except Stop as stop:
                with self.lock:
                    self.claimed[p] = held
                self._fail(p, str(stop))
                continue
            with self.lock:
                self.claimed[p] = held
            self._rebuild = True
            log.info("%s: %s claimed partition %d at offset %d", self.name, self.owner, p,
                     held.next)  # fmt: skip

    def _check_claimed(self, held: Claimed) -> None:
        """A claimed partition's token against the broker: its first offset, the topic id."""
        assert self.table is not None
        p = held.partition
        seen = self.table.seen(self.name).get(p)
        if self._topic_id and seen is not None and seen.topic_id != self._topic_id:
            if held.next > 0 and seen.topic_id is not None:
                raise Stop(
                    f"offset out of range: partition {p} of topic {self.ing.topic} was read up "
                    f"to offset {held.next}, but the topic was deleted and created again (id "
                    f"{seen.topic_id} is now {self._topic_id}); nothing was written. Reset the "
                    "ingestor's tokens if the new topic is to be read from its start"
                )
            with self.rt.db.transaction() as conn:  # nothing read from the old one: adopt it
                self.table.set_topic_id(conn, self.name, p, self._topic_id)
        probe = self._consumer or client.consumer(self.ing.kafka)
        try:
            low = client.low_watermark(probe, self.ing.topic, p, self.timeout)
        finally:
            if probe is not self._consumer:
                probe.close()
        if held.next < low:
            raise Stop(self._out_of_range(p, held.next, low, None))

    def _out_of_range(self, p: int, token: int, low: int | None, high: int | None) -> str:
        where = (f"the broker's offsets are {low}..{high}" if high is not None
                 else f"the broker's first offset is {low}")  # fmt: skip
        why = ("retention or a deletion passed it" if low is not None and token < low
               else "the topic was recreated or truncated")  # fmt: skip
        return (f"offset out of range: partition {p} of topic {self.ing.topic} is at offset "
                f"{token} (its token), but {where} ({why}); nothing was written")  # fmt: skip

    def _check_marks(self) -> None:
        """Record the watermarks fetched (for status and lag) and stop partitions whose token
        is past the broker's high watermark (a topic recreated or truncated)."""
        if self._consumer is None or self.table is None or self._rebuild:
            return  # a consumer about to be replaced may know a partition from an older claim
        ck = client.client_module()
        marks: dict[int, tuple[int, int]] = {}
        for p, held in list(self.claimed.items()):
            low, high = self._consumer.get_watermark_offsets(
                ck.TopicPartition(self.ing.topic, p), cached=True
            )
            if high < 0:
                continue  # nothing fetched yet in this consumer
            if held.next > high:
                self._fail(p, self._out_of_range(p, held.next, low if low >= 0 else None, high))
                continue
            if self._marks.get(p) != (low, high):
                marks[p] = (low, high)
        if marks:
            self.table.observe(self.name, marks)
            self._marks.update(marks)

    def _assign(self) -> None:
        """A fresh consumer, assigned to the held partitions at their tokens."""
        ck = client.client_module()
        self._close_consumer()
        self._rebuild = False
        if not self.claimed:
            return
        # order="time" waits for a partition until the consumer says it reached its end
        eof = {"enable.partition.eof": True} if self._time_order is not None else {}
        self._consumer = client.consumer(self.ing.kafka, error_cb=self._client_cb, **eof)
        self._consumer.assign(
            [ck.TopicPartition(self.ing.topic, p, h.next) for p, h in sorted(self.claimed.items())]
        )

    # -- what goes wrong -----------------------------------------------------------------------
    def _client_error(self, message: Any, err: Any) -> None:
        ck = client.client_module()
        code = err.code()
        if code in (ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE):
            p = message.partition()
            held = self.claimed.get(p)
            if held is not None:
                try:
                    low, high = self._consumer.get_watermark_offsets(
                        ck.TopicPartition(self.ing.topic, p), timeout=self.timeout
                    )
                except ck.KafkaException:
                    low = high = None
                self._fail(p, self._out_of_range(p, held.next, low, high))
            return
        if err.fatal():
            raise ck.KafkaException(err)
        self._down(err.str())

    def _client_cb(self, err: Any) -> None:
        if err.fatal():
            log.error("%s: Kafka client failed: %s", self.name, err.str())
            return
        self._down(err.str())

    def _down(self, what: str) -> None:
        if self._outage is None:
            log.warning("%s: Kafka broker unavailable (%s); waiting for it", self.name, what)
        self._outage = what

    def _fail(self, p: int, reason: str) -> None:
        """The partition stops: its failure recorded, released with back-off."""
        self._observe_one(p)  # status shows how far behind the stopped partition is
        self._forget(p)
        self.rt.observer.failed(self.name, str(p), reason)
        delay = self.tokens.fail(self.name, p, self.owner, reason)
        log.error("%s: partition %d: %s; released, retrying in %.0f s", self.name, p, reason,
                  delay)  # fmt: skip

    def _observe_one(self, p: int) -> None:
        if self._consumer is None or self.table is None or self._rebuild:
            return
        ck = client.client_module()
        try:
            low, high = self._consumer.get_watermark_offsets(
                ck.TopicPartition(self.ing.topic, p), cached=True
            )
            if high >= 0 and self._marks.get(p) != (low, high):
                self.table.observe(self.name, {p: (low, high)})
                self._marks[p] = (low, high)
        except Exception as exc:  # noqa: BLE001 - only for status: the failure matters more
            log.warning("%s: partition %d: could not record its watermarks: %s", self.name, p,
                        exc)  # fmt: skip

    def _held(self, held: set[int], since: float) -> None:
        with self.lock:
            for p, h in self.claimed.items():
                if p not in held and h.claimed_at < since:  # a later claim: the next beat's
                    h.lost = True

    def _forget(self, p: int) -> None:
        with self.lock:
            if self.claimed.pop(p, None) is not None:
                self._rebuild = True

    def _let_go(self, why: str) -> None:
        # stop reading first: a released partition is read by no consumer of this node (a
        # topic deleted under an open consumer crashes librdkafka 2.16 on Tansu)
        self._close_consumer()
        for p in list(self.claimed):
            log.info("%s: releasing partition %d (%s)", self.name, p, why)
            self._forget(p)
            self.tokens.release(self.name, p, self.owner)

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing a consumer of a broker that is gone
                pass

    def _shutdown(self) -> None:
        self.heartbeat.stop()
        self._close_consumer()
        try:
            for p in list(self.claimed):
                self.tokens.release(self.name, p, self.owner)
            self.tokens.leave(self.name, self.owner)
        except Exception as exc:  # noqa: BLE001 - the claims expire by themselves
            log.warning("%s: could not release claims on shutdown (%s); they expire", self.name,
                        exc)  # fmt: skip
        with self.lock:
            self.claimed.clear()
