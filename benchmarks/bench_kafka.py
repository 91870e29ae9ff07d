"""Kafka ingest, on a Tansu broker started for the run (eventlanes.testing.kafka).

1. Throughput: an ingestor appending a 4-partition topic of keyed JSON records (one token per
   partition in each transaction, claims, heartbeat) against a plain loop that consumes the
   same topic with the same client settings, turns records into the same events and appends
   them in batches of the same size, with no offsets and no claims. Runs alternate in one run;
   the stores they fill must hold the same streams, versions and events.
2. Latency: records produced at a steady 1,000/s; each one's time from produce to its row in a
   projection (an exactly-once processor over the ingested events) being committed, as a
   poller sees it; beside it, produce -> received by a plain consumer (the broker and client
   alone).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import eventlanes as el
from eventlanes.kafka import client
from eventlanes.kafka.records import Converter, Record
from eventlanes.testing.kafka import TansuBroker

from .common import databases, print_table

PARTITIONS = 4
BATCH = 2000


def _topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
        future.result(10)
    return name


def _produce(bootstrap: str, topic: str, n: int, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})  # fmt: skip
    for i in range(n):
        value = json.dumps({"robot": i % keys, "n": i, "torque": 2.5, "ok": True}).encode()
        while True:
            try:
                producer.produce(topic, value, f"robot-{i % keys}".encode(),
                                 headers=[("type", b"Screwed")])  # fmt: skip
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _ours(url: str, kafka: el.Kafka, topic: str, n: int) -> float:
    app = el.App(url)
    app.ingest("in", kafka, topic=topic, batch_size=BATCH)
    app.store.head()  # schema created before the clock starts
    app.tokens.status("in")
    done = app.db.sql(f"SELECT coalesce(sum(position), 0) FROM {app.db.table('tokens')} "
                      "WHERE processor = ?")  # fmt: skip
    start = time.perf_counter()
    app.start()
    try:
        while app.db.query(done, ("in",))[0][0] < n:  # one cheap read per 20 ms
            time.sleep(0.02)
        seconds = time.perf_counter() - start
    finally:
        app.stop()
        app.close()
    return seconds


def _plain(url: str, kafka: el.Kafka, topic: str, n: int) -> float:
    """Consume all partitions, convert, append each batch in one transaction (runs of one
    stream per append, in offset order per partition): no tokens, no claims."""
    ck = client.client_module()
    store = el.open_store(url)
    conv = Converter(topic, None, None, None, 1_048_576)
    start = time.perf_counter()
    consumer = client.consumer(kafka)
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    done = 0
    try:
        while done < n:
            first = consumer.poll(0.1)
            if first is None:
                continue
            messages = [first, *consumer.consume(BATCH - 1, timeout=0)]
            by_partition: dict[int, list[Any]] = defaultdict(list)
            for m in messages:
                if m.error() is None:
                    by_partition[m.partition()].append(m)
            with store.db.transaction(pipeline=True) as conn:  # as the ingestor does
                for _p, ms in sorted(by_partition.items()):
                    runs: list[tuple[str, list[Any]]] = []
                    for m in ms:
                        record = Record.of(m)
                        stream = conv.stream(record)
                        event = conv.event(record, stream)
                        if runs and runs[-1][0] == stream:
                            runs[-1][1].append(event)
                        else:
                            runs.append((stream, [event]))
                    store.append_runs(runs, conn=conn)  # the fastest plain append
                    done += len(ms)
        seconds = time.perf_counter() - start
    finally:
        consumer.close()
        store.close()
    return seconds


def _contents(url: str) -> dict[str, list[tuple[Any, ...]]]:
    store = el.open_store(url)
    streams: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for e in store.iter_events(batch_size=20_000):
        streams[e.stream_id].append((e.version, e.type, e.data, e.metadata))
    store.close()
    return dict(streams)


def throughput(backends: list[str], quick: bool) -> None:
    n = 20_000 if quick else 200_000
    rounds = 1 if quick else 2
    rows = []
    with TansuBroker() as broker, databases(backends) as dbs:
        kafka = el.Kafka(broker.bootstrap)
        topic = _topic(broker.bootstrap, PARTITIONS)
        _produce(broker.bootstrap, topic, n, keys=5000)
        for name, new_url in dbs.items():
            ours, plain = [], []
            urls: dict[str, str] = {}
            for _ in range(rounds):
                urls["ours"] = new_url()
                ours.append(n / _ours(urls["ours"], kafka, topic, n))
                urls["plain"] = new_url()
                plain.append(n / _plain(urls["plain"], kafka, topic, n))
            same = _contents(urls["ours"]) == _contents(urls["plain"])
            o, p = statistics.median(ours), statistics.median(plain)
            rows.append([name, n, o, p, f"{o / p:.2f}x", "yes" if same else "NO"])
            if not same:
                raise AssertionError(f"{name}: the ingestor's store differs from the plain loop's")
    print_table(
        "Kafka ingest: records/s appended (median of rounds; target >= 0.8x)",
        ["backend", "records", "ingestor", "plain loop", "ratio", "same events"],
        rows,
    )


def _latency(url: str, kafka: el.Kafka, bootstrap: str, rate: int, seconds: float) -> list[float]:
    from confluent_kafka import Producer

    topic = _topic(bootstrap, PARTITIONS)
    app = el.App(url)
    app.ingest("in", kafka, topic=topic, type="Ping", batch_size=BATCH)
    proj = app.processor("seen", segments=4)
    table = app.db.table("bench_seen")
    app.db.run_ddl(
        [f"CREATE TABLE IF NOT EXISTS {table} (i BIGINT PRIMARY KEY, sent DOUBLE PRECISION)"]
    )

    @proj.on("Ping")
    def project(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(f"INSERT INTO {table} (i, sent) VALUES ({p}, {p})",
                    (event.data["i"], event.data["sent"]))  # fmt: skip

    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        low = 0  # every record below it was seen (segments commit out of order)
        sql = app.db.sql(f"SELECT i, sent FROM {table} WHERE i >= ?")
        while not stop.is_set():
            now = time.time()
            for i, sent in app.db.query(sql, (low,)):
                if i not in seen:
                    seen[i] = now - sent
            while low in seen:
                low += 1
            time.sleep(0.001)

    app.start()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 1})  # fmt: skip
    total = int(rate * seconds)
    try:
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            while time.perf_counter() < due:
                time.sleep(max(0.0, due - time.perf_counter()))
            value = json.dumps({"i": i, "sent": time.time()}).encode()
            producer.produce(topic, value, f"k{i % 100}".encode())
            producer.poll(0)
        producer.flush(30)
        deadline = time.monotonic() + 60
        while len(seen) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        poller.join()
        app.stop()
        app.close()
    if len(seen) < total:
        raise AssertionError(f"only {len(seen)} of {total} records reached the projection")
    warm = int(rate)  # the first second warms up the clients
    return sorted(v for i, v in seen.items() if i >= warm)


def _floor(bootstrap: str, rate: int, seconds: float) -> list[float]:
    """Produce -> a plain consumer receives it: the broker and the client alone."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = _topic(bootstrap, PARTITIONS)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "floor",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: list[float] = []
    total = int(rate * seconds)
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set() and len(got) < total:
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                got.append(time.time() - json.loads(m.value())["sent"])

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 1})  # fmt: skip
    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        while time.perf_counter() < due:
            time.sleep(max(0.0, due - time.perf_counter()))
        producer.produce(topic, json.dumps({"sent": time.time()}).encode(), f"k{i % 100}".encode())
        producer.poll(0)
    producer.flush(30)
    reader.join(30)
    stop.set()
    consumer.close()
    return sorted(got[int(rate) :])


def _q(ordered: list[float], q: float) -> str:
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"


def latency(backends: list[str], quick: bool) -> None:
    rate, seconds = 1000, (5.0 if quick else 15.0)
    rows = []
    with TansuBroker() as broker, databases(backends) as dbs:
        kafka = el.Kafka(broker.bootstrap)
        floor = _floor(broker.bootstrap, rate, seconds)
        rows.append(["broker + client alone", len(floor), _q(floor, 0.5), _q(floor, 0.99), ""])
        for name, new_url in dbs.items():
            lat = _latency(new_url(), kafka, broker.bootstrap, rate, seconds)
            rows.append([f"{name}: produce -> projection committed", len(lat), _q(lat, 0.5),
                         _q(lat, 0.99), "< 100"])  # fmt: skip
    print_table(
        f"Kafka end to end at a steady {rate:,} records/s (ms)",
        ["path", "records", "p50", "p99", "target p99"],
        rows,
    )


def run(backends: list[str], quick: bool = False) -> None:
    throughput(backends, quick)
    latency(backends, quick)
