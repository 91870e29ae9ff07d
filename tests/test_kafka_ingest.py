"""Kafka ingest on a real broker (the session's Tansu): exactly once, per-key order, bad
records, offsets that vanished, status, the CLI. Both store backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes.kafka import parking
from tests.kafka_helpers import create_topic, delete_topic, high_watermarks, produce
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.kafka_app:app"


def _app(store_url: str, bootstrap: str, topic: str, **options: Any) -> el.App:
    from tests.apps.kafka_app import make_app

    return make_app(store_url, bootstrap, topic, **options)


def _tokens(app: el.App, name: str = "readings-in") -> dict[int, int]:
    return {s.segment.id: s.position for s in app.tokens.status(name)}


def _wait_ingested(app: el.App, hw: dict[int, int], timeout: float = 60.0) -> None:
    wait_for(lambda: _tokens(app) == hw, timeout=timeout, what=f"tokens {hw}")


def _ingest(app: el.App, hw: dict[int, int]) -> None:
    """Start ``app``, wait until its tokens are at ``hw``, stop it (also when the wait fails)."""
    app.start()
    try:
        _wait_ingested(app, hw)
    finally:
        app.stop()


def _by_stream(app: el.App) -> dict[str, list[el.Event]]:
    streams: dict[str, list[el.Event]] = defaultdict(list)
    for e in app.store.iter_events():
        streams[e.stream_id].append(e)
    return streams


def test_ingest_exactly_once_in_offset_order(store_url: str, kafka_broker) -> None:
    """Keyed records become events: the key is the stream, headers metadata, the Kafka
    coordinates the root of the source chain; each key's events in offset order; every
    partition's token ends at its high watermark; status shows them."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 3)
    records = [(f"robot-{i % 7}", {"i": i}, [("type", b"Screwed"), ("cell", b"c1")])
               for i in range(3000)]  # fmt: skip
    produce(b, topic, records)
    hw = high_watermarks(b, topic, 3)
    assert sum(hw.values()) == 3000
    app = _app(store_url, b, topic, batch_size=256)
    app.start()
    try:
        _wait_ingested(app, hw)
        wait_for(lambda: all(p.high_watermark is not None
                             for p in app.ingest_status("readings-in").partitions),
                 what="watermarks recorded")  # fmt: skip
        view = app.ingest_status("readings-in")
    finally:
        app.stop()
    assert app.store.count() == 3000
    assert [(p.partition, p.position, p.high_watermark, p.lag) for p in view.partitions] == [
        (p, hw[p], hw[p], 0) for p in range(3)
    ]
    seen = set()
    for stream, events in _by_stream(app).items():
        offsets = [
            (e.metadata["kafka"]["partition"], e.metadata["kafka"]["offset"]) for e in events
        ]
        assert len({p for p, _ in offsets}) == 1  # one key, one partition
        assert offsets == sorted(offsets), stream  # versions follow offsets
        assert [e.data["i"] for e in events] == sorted(e.data["i"] for e in events)
        seen.update(offsets)
        e = events[0]
        assert e.type == "Screwed" and e.metadata["headers"] == {"type": "Screwed", "cell": "c1"}
        p, o = offsets[0]
        assert e.metadata["source_chain"] == [
            {"source": topic, "partition": str(p), "offset": o, "out": 0}
        ]
    assert len(seen) == 3000


def test_restart_resumes_where_the_tokens_are(store_url: str, kafka_broker) -> None:
    """Stopped and started again with more records on the topic: only the new ones are
    appended (the tokens are the offsets; nothing is committed to the broker)."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [(f"k{i % 5}", {"i": i}, None) for i in range(500)])
    app = _app(store_url, b, topic)
    _ingest(app, high_watermarks(b, topic, 2))
    produce(b, topic, [(f"k{i % 5}", {"i": i}, None) for i in range(500, 800)])
    again = _app(store_url, b, topic)
    again.start()
    try:
        _wait_ingested(again, high_watermarks(b, topic, 2))
    finally:
        again.stop()
    values = sorted(e.data["i"] for e in again.store.iter_events())
    assert values == list(range(800))


def test_json_the_store_cannot_keep_is_a_bad_record(store_url: str, kafka_broker) -> None:
    """Valid JSON with NaN, an infinity, a NUL character or a lone surrogate: the store
    refuses it, and before that refusal crashed the ingestor (the whole batch rolled back,
    no dead letter, status healthy at offset 0). Now each is a bad record, parked with why,
    and the others are appended."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [
        ("a", {"n": 1}, None), ("b", b'{"n": NaN}', None), ("c", b'{"n": -Infinity}', None),
        ("d", b'{"s": "a\\u0000b"}', None), ("e", b'{"s": "\\ud800"}', None),
        ("f", b'{"s": "caf\\u00e9 \\ud83d\\ude00"}', None), ("a", {"n": 2}, None),
    ])  # fmt: skip
    app = _app(store_url, b, topic, on_bad="dead_letter")
    _ingest(app, {0: 7})
    streams = _by_stream(app)
    assert [e.data for e in streams["a"]] == [{"n": 1}, {"n": 2}]
    assert [e.data for e in streams["f"]] == [{"s": "caf\u00e9 \U0001f600"}]
    letters = app.dead_letter_list("readings-in")
    assert [d.seq_key for d in letters] == ["b", "c", "d", "e"]
    assert all("cannot be decoded" in d.error for d in letters)
    assert "NaN" in letters[0].error and "NUL" in letters[2].error
    assert "surrogate" in letters[3].error


def test_bad_records_parked_in_order_and_retried(store_url: str, kafka_broker) -> None:
    """on_bad="dead_letter": a value that is not JSON is parked with its coordinates, and the
    later records of its stream wait behind it, in order; other streams go on. A retry with a
    fixed decoder appends them in offset order; a record without a key stays parked until
    discarded."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [
        ("a", {"n": 1}, None), ("a", b"not json", None), ("b", {"n": 1}, None),
        ("a", {"n": 3}, None), (None, {"n": 0}, None), ("b", {"n": 2}, None),
    ])  # fmt: skip
    app = _app(store_url, b, topic, on_bad="dead_letter")
    _ingest(app, {0: 6})
    streams = _by_stream(app)
    assert [e.data for e in streams["a"]] == [{"n": 1}]
    assert [e.data for e in streams["b"]] == [{"n": 1}, {"n": 2}]
    letters = app.dead_letter_list("readings-in")
    assert [(parking.ParkedRecord.of(d).offset, d.seq_key) for d in letters] == [
        (1, "a"), (3, "a"), (4, None)
    ]  # fmt: skip
    assert "not be decoded" in letters[0].error and "offset 1" in letters[0].error
    assert "waits behind" in letters[1].error
    assert "no key" in letters[2].error
    doc = _status_json(store_url)
    assert doc["healthy"] is False
    assert doc["ingestors"][0]["problems"] == ["3 record(s) parked"]

    def lenient(value: bytes | None) -> dict[str, Any]:
        try:
            return json.loads(value or b"")
        except ValueError:
            return {"raw": (value or b"").decode()}

    app.ingestors["readings-in"].converter.decode = lenient
    assert app.retry_dead_letters("readings-in") == (2, 1)
    assert [e.data for e in _by_stream(app)["a"]] == [{"n": 1}, {"raw": "not json"}, {"n": 3}]
    [left] = app.dead_letter_list("readings-in")
    assert left.seq_key is None and left.attempts == 2
    assert app.discard_dead_letters("readings-in") == 1
    assert _tokens(app) == {0: 6}


def test_bad_record_stops_its_partition_by_default(store_url: str, kafka_broker) -> None:
    """on_bad="stop" (the default): the records before the bad one are appended, the token
    stops at it, the reason (partition and offset) is in status, the other partition goes on;
    nothing is skipped."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [("a", {"n": 1}, None), ("a", b"[1, 2]", None), ("a", {"n": 3}, None)],
            partition=0)  # fmt: skip
    produce(b, topic, [("b", {"n": 1}, None), ("b", {"n": 2}, None)], partition=1)
    app = _app(store_url, b, topic)
    app.start()
    try:
        wait_for(lambda: _tokens(app) == {0: 1, 1: 2}, what="tokens")
        wait_for(lambda: app.ingest_status("readings-in").partitions[0].errors >= 1,
                 what="partition 0 failed")  # fmt: skip
        view = app.ingest_status("readings-in")
    finally:
        app.stop()
    error = view.partitions[0].last_error
    assert "record at offset 1 of partition 0 is bad" in error and "not an object" in error
    assert [e.data for e in app.store.iter_events()] == [{"n": 1}, {"n": 1}, {"n": 2}]
    assert _tokens(app) == {0: 1, 1: 2}
    assert app.dead_letter_list("readings-in") == []


def test_recreated_topic_is_an_error_naming_both_offsets(store_url: str, kafka_broker) -> None:
    """A topic deleted and created again behind the ingestor's back: its tokens are past the
    new high watermark (or the topic id changed): the partition stops with an error naming
    it and both offsets, and nothing of the new topic is written."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 1)
    produce(b, topic, [(f"k{i}", {"i": i}, None) for i in range(10)])
    app = _app(store_url, b, topic)
    _ingest(app, {0: 10})
    delete_topic(b, topic)
    create_topic(b, 1, name=topic)
    produce(b, topic, [(f"k{i}", {"i": i}, None) for i in range(3)])
    again = _app(store_url, b, topic)
    again.start()
    try:
        wait_for(lambda: again.ingest_status("readings-in").partitions[0].errors >= 1,
                 what="the partition to fail")  # fmt: skip
    finally:
        again.stop()
    error = again.ingest_status("readings-in").partitions[0].last_error
    assert "offset out of range: partition 0 of topic" in error
    assert "offset 10" in error and "nothing was written" in error
    assert again.store.count() == 10 and _tokens(again) == {0: 10}
    # refilled past the token: the new topic id gives it away
    produce(b, topic, [(f"k{i}", {"i": i}, None) for i in range(3, 20)])
    third = _app(store_url, b, topic)
    third.start()
    try:
        wait_for(lambda: third.ingest_status("readings-in").partitions[0].errors >= 2,
                 timeout=30, what="the partition to fail again")  # fmt: skip
    finally:
        third.stop()
    error = third.ingest_status("readings-in").partitions[0].last_error
    assert "deleted and created again" in error and "offset 10" in error
    assert third.store.count() == 10 and _tokens(third) == {0: 10}


def test_grown_topic_partitions_are_picked_up(store_url: str, kafka_broker) -> None:
    """Partitions that appear while the ingestor runs get token rows and are read from their
    start. (Tansu has no CreatePartitions: the topic, still empty, is created again with more
    partitions; the ingestor sees what it sees after CreatePartitions: more partitions. It is
    paused meanwhile: librdkafka 2.16 crashes when a topic it reads is deleted on Tansu.)"""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    app = _app(store_url, b, topic)
    app.start()
    try:
        wait_for(lambda: sorted(_tokens(app)) == [0, 1], what="two partitions")
        app.pause("readings-in")
        wait_for(lambda: not any(s.owner for s in app.tokens.status("readings-in")),
                 what="partitions released")  # fmt: skip
        delete_topic(b, topic)
        create_topic(b, 4, name=topic)
        app.resume("readings-in")
        produce(b, topic, [(f"k{i}", {"i": i}, None) for i in range(400)])
        hw = high_watermarks(b, topic, 4)
        assert all(hw.values())
        _wait_ingested(app, hw, timeout=60)
    finally:
        app.stop()
    assert sorted(e.data["i"] for e in app.store.iter_events()) == list(range(400))


def test_a_topic_that_does_not_exist_is_refused_and_never_created(tmp_path, kafka_broker) -> None:
    """Asking about a topic never creates it. Tansu creates a topic a client asks about, as
    Kafka does with its default ``auto.create.topics.enable``: an ingestor of a misspelt topic
    got a new empty topic to wait on, and one paused while its topic was deleted (to be created
    again with more partitions) re-created it with the broker's default partitions."""
    import uuid

    from confluent_kafka.admin import AdminClient

    b = kafka_broker.bootstrap
    name = f"misspelt-{uuid.uuid4().hex[:8]}"
    app = _app(f"sqlite:///{tmp_path}/s.db", b, name)
    with pytest.raises(el.InvalidInputError, match=f"Kafka topic '{name}' does not exist"):
        app.start()
    app.stop()
    assert name not in AdminClient({"bootstrap.servers": b}).list_topics(timeout=10).topics


class _Tracked:
    """A real consumer that says whether it was closed."""

    def __init__(self, real: Any) -> None:
        self._real, self.closed = real, False

    def close(self) -> None:
        self.closed = True
        self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_paused_ingestor_stops_reading_before_it_releases(tmp_path, kafka_broker,
                                                            monkeypatch) -> None:  # fmt: skip
    """Released partitions are not read by this node any more: the consumer is closed before
    the claims are given up, so a topic deleted once they show released (to be created again
    with more partitions) is read by no consumer still open. Released first, the topic was
    deleted under an open consumer, which crashes librdkafka 2.16 on Tansu (a segfault that
    killed a test worker)."""
    from eventlanes.kafka import client
    from eventlanes.tokens.base import TokenStore

    consumers: list[_Tracked] = []
    real_consumer, real_release = client.consumer, TokenStore.release

    def consumer(*args: Any, **kwargs: Any) -> _Tracked:
        consumers.append(_Tracked(real_consumer(*args, **kwargs)))
        return consumers[-1]

    open_at_release: list[int] = []

    def release(self: TokenStore, processor: str, *args: Any, **kwargs: Any) -> bool:
        if processor == "readings-in":
            open_at_release.append(sum(not c.closed for c in consumers))
        return real_release(self, processor, *args, **kwargs)

    monkeypatch.setattr(client, "consumer", consumer)
    monkeypatch.setattr(TokenStore, "release", release)
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    app = _app(f"sqlite:///{tmp_path}/s.db", b, topic)
    app.start()
    try:
        # both claimed (their rows may exist before the second claim, under load)
        wait_for(lambda: [bool(s.owner) for s in app.tokens.status("readings-in")] == [True] * 2,
                 what="two partitions claimed")  # fmt: skip
        wait_for(lambda: any(not c.closed for c in consumers), what="a consumer reading")
        app.pause("readings-in")
        wait_for(lambda: not any(s.owner for s in app.tokens.status("readings-in")),
                 what="partitions released")  # fmt: skip
        assert open_at_release == [0, 0]
    finally:
        app.stop()


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _env(url: str, bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"EVENTLANES_TEST_KAFKA_URL": url, "EVENTLANES_TEST_KAFKA_BOOTSTRAP": bootstrap,
                "EVENTLANES_TEST_KAFKA_TOPIC": topic})  # fmt: skip
    env.update({f"EVENTLANES_TEST_KAFKA_{k.upper()}": v for k, v in extra.items()})
    return env


def _status_json(url: str) -> dict[str, Any]:
    done = _cli("status", "--url", url, "--json")
    return json.loads(done.stdout)


def test_broker_unreachable_at_start_is_one_error_line(tmp_path) -> None:
    env = _env(f"sqlite:///{tmp_path}/s.db", "127.0.0.1:1", "readings", timeout="2")
    done = _cli("run", APP, "--no-progress", env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Kafka broker(s) 127.0.0.1:1 did not "
                                                   "answer within 2 s"), done.stdout  # fmt: skip
    done = _cli("run", APP, "--no-progress", "--processes", "2", env=env)
    assert done.returncode == 2 and done.stdout.count("error:") == 1, done.stdout


def test_cli_status_and_secrets(tmp_path, kafka_broker) -> None:
    """`run --kafka-file` passes options through (a secret among them) to the workers; the
    secret is never in the logs or the status; `status` shows each partition's position,
    high watermark and lag, and its exit code follows health."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [(f"k{i % 3}", {"i": i}, None) for i in range(100)])
    url = f"sqlite:///{tmp_path}/s.db"
    secrets = tmp_path / "kafka.properties"
    secrets.write_text(f"bootstrap.servers={b}\nssl.key.password=hunter2-secret\n")
    env = _env(url, "127.0.0.1:1", topic)  # the file's bootstrap servers win
    worker = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "--log-level", "debug", "run", APP,
         "--no-progress", "--processes", "2", "--kafka-file", str(secrets)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        app = _app(url, b, topic)
        wait_for(lambda: _tokens(app) == high_watermarks(b, topic, 2) and len(_tokens(app)) == 2,
                 timeout=60, what="ingested")  # fmt: skip
        wait_for(lambda: all(p["high_watermark"] is not None
                             for p in _status_json(url)["ingestors"][0]["partitions"]),
                 what="watermarks")  # fmt: skip
    finally:
        worker.terminate()
        out, err = worker.communicate(timeout=60)
    assert "hunter2" not in out + err
    done = _cli("status", APP, env=_env(url, b, topic))
    assert done.returncode == 0, done.stdout
    assert "readings-in (Kafka topic" in done.stdout and "hunter2" not in done.stdout
    doc = json.loads(_cli("status", "--url", url, "--json").stdout)
    [ing] = doc["ingestors"]
    assert doc["healthy"] and ing["lag_records"] == 0 and ing["position"] == 100
    assert [(p["partition"], p["lag_records"]) for p in ing["partitions"]] == [(0, 0), (1, 0)]
    assert "hunter2" not in json.dumps(doc)
    # status never asks the broker: the watermark is the last one fetched, and says how old
    assert all(p["watermark_age_seconds"] >= 0 for p in ing["partitions"])
    # a stopped partition makes status unhealthy (exit 1), with the reason
    produce(b, topic, [("k1", b"not json", None)], partition=0)
    worker = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress"],
        cwd=ROOT, env=_env(url, b, topic), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: _cli("status", "--url", url).returncode == 1, timeout=60,
                 what="unhealthy status")  # fmt: skip
    finally:
        worker.terminate()
        worker.wait(60)
    done = _cli("status", "--url", url)
    assert "unhealthy: readings-in: partition 0" in done.stdout and "is bad" in done.stdout


def test_definition_errors_are_refused_where_written(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    kafka = el.Kafka("127.0.0.1:9092")
    bad: list[dict[str, Any]] = [
        {"topic": "no spaces"}, {"topic": "t", "on_bad": "skip"}, {"topic": "t", "initial": 5},
        {"topic": "t", "batch_size": 0}, {"topic": "t", "type": 3}, {"topic": "t", "stream": "k"},
        {"topic": "t", "max_record_bytes": -1},
    ]  # fmt: skip
    for options in bad:
        with pytest.raises(el.InvalidInputError):
            app.ingest("in", kafka, **options)
    with pytest.raises(el.InvalidInputError, match="group.id"):
        el.Kafka("h:1", {"group.id": "mine"})
    app.ingest("in", kafka, topic="t")
    with pytest.raises(el.InvalidInputError, match="already defined"):
        app.processor("in")
    assert "hunter2" not in repr(el.Kafka("h:1", {"sasl.password": "hunter2"}))


def test_wait_until_caught_up_waits_for_the_ingest_too(store_url: str, kafka_broker) -> None:
    """Before: ``app.wait_until_caught_up()`` looked at processors only, so with an ingestor
    feeding an aggregation it returned while the records were still on the broker (the
    aggregation was at the head of a store the ingest had not filled yet). Now it first
    waits for every record the topic held when it was called (one batch of several records
    per partition: a fetch's high watermark, not ListOffsets', which Tansu answers short)."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [(f"robot-{i % 5}", {"n": i}, [("type", b"Screwed")]) for i in range(400)],
            **{"linger.ms": 200})  # fmt: skip
    app = _app(store_url, b, topic)
    sums = app.aggregation("sums", key=lambda e: e.stream_id, initial=lambda: {"n": 0, "c": 0},
                           persist_every=0.05)  # fmt: skip

    @sums.on("Screwed")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += event.data["n"]
        state["c"] += 1

    app.start()
    try:
        app.wait_until_caught_up(60)
        got = {f"robot-{r}": sums.get(f"robot-{r}") for r in range(5)}
    finally:
        app.stop()
    assert got == {f"robot-{r}": {"n": sum(range(r, 400, 5)), "c": 80} for r in range(5)}
    assert app.store.count() == 400
    # Named: only what is named is waited for (an ingestor alone, too).
    app.start(["readings-in"])
    try:
        app.wait_until_caught_up(30, ["readings-in"])
    finally:
        app.stop()


def test_a_commit_whose_answer_was_lost_is_not_appended_again(
    tmp_path: Path, kafka_broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database committed a batch, and the connection was lost before the ingestor heard
    it (``pg_ctl stop -m immediate`` at that moment did it in the suite: 500 records appended
    twice). The next round reads the tokens again: the batch is not appended a second time."""
    import contextlib

    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [(f"k{i % 7}", {"n": i}, None) for i in range(300)])
    hw = high_watermarks(b, topic, 2)
    app = _app(f"sqlite:///{tmp_path}/lost.db", b, topic, batch_size=40)
    real = app.db.transaction
    commits = {"n": 0}

    @contextlib.contextmanager
    def answer_lost(pipeline: bool = False) -> Any:
        with real(pipeline=pipeline) as conn:
            yield conn
        if pipeline:  # the ingestor's appends: the second one commits, its answer is lost
            commits["n"] += 1
            if commits["n"] == 2:
                raise el.DatabaseUnavailableError("commit", "the connection was lost")

    monkeypatch.setattr(app.db, "transaction", answer_lost)
    _ingest(app, hw)
    assert commits["n"] > 2  # it failed once and went on
    offsets = [(e.metadata["kafka"]["partition"], e.metadata["kafka"]["offset"])
               for e in app.store.iter_events()]  # fmt: skip
    assert len(offsets) == len(set(offsets)) == 300
