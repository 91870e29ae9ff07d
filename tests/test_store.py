"""Event store conformance: written once, run against every backend."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zlib import crc32

import pytest

import eventlanes as el

E = el.NewEvent


def test_append_and_read_round_trip(store: el.EventStore) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    data = {"size": 20, "nested": {"list": [1, 2.5, None, True]}, "text": "Grüße ✓"}
    positions = store.append(
        "user-carlo", [E("FrontWheelAdded", data, metadata={"by": "test"})], expected_version=0
    )
    assert positions == [1]
    [event] = store.read(after=0)
    assert event.position == 1
    assert event.stream_id == "user-carlo"
    assert event.version == 1
    assert event.type == "FrontWheelAdded"
    assert event.data == data
    assert event.metadata == {"by": "test"}
    assert event.routing_hash == crc32(b"user-carlo") == el.stable_hash("user-carlo")
    assert event.recorded_at.tzinfo is not None
    assert before <= event.recorded_at <= datetime.now(UTC) + timedelta(seconds=1)
    assert event.idempotency_key == ("user-carlo", 1)
    # Handlers share events: their fields are read-only.
    for attr in ("position", "stream_id", "type", "data", "metadata", "source", "extra"):
        with pytest.raises(AttributeError):
            setattr(event, attr, "changed")
    assert event.position == 1 and event.data == data


def test_positions_and_versions(store: el.EventStore) -> None:
    assert store.head() == 0
    assert store.append("a", [E("A1"), E("A2")], expected_version=0) == [1, 2]
    assert store.append("b", [E("B1")]) == [3]
    assert store.append("a", [E("A3")], expected_version=2) == [4]
    assert store.head() == 4
    assert [(e.stream_id, e.version) for e in store.read()] == [
        ("a", 1),
        ("a", 2),
        ("b", 1),
        ("a", 3),
    ]
    assert [e.position for e in store.read(after=1, limit=2)] == [2, 3]
    assert [e.type for e in store.read_stream("a")] == ["A1", "A2", "A3"]
    assert [e.type for e in store.read_stream("a", after_version=1)] == ["A2", "A3"]
    assert store.read_stream("a", after_version=1, limit=1)[0].type == "A2"
    assert store.read_stream("missing") == []
    assert store.stream_version("a") == 3
    assert store.stream_version("missing") == 0


def test_wrong_expected_version_names_everything_and_writes_nothing(store: el.EventStore) -> None:
    store.append("user-carlo", [E("A"), E("B")], expected_version=0)
    with pytest.raises(el.ConcurrencyError) as info:
        store.append("user-carlo", [E("C"), E("D")], expected_version=1)
    err = info.value
    assert (err.stream_id, err.expected, err.actual) == ("user-carlo", 1, 2)
    assert "user-carlo" in str(err) and "1" in str(err) and "2" in str(err)
    with pytest.raises(el.ConcurrencyError):
        store.append("user-carlo", [E("C")], expected_version=0)
    with pytest.raises(el.ConcurrencyError):
        store.append("new-stream", [E("C")], expected_version=3)
    assert store.head() == 2
    assert store.stream_version("user-carlo") == 2
    assert store.stream_version("new-stream") == 0
    # And the stream still accepts the right version afterwards.
    assert store.append("user-carlo", [E("C")], expected_version=2) == [3]


@pytest.mark.parametrize(
    "stream_id, events, match",
    [
        ("", [E("A")], "stream id"),
        ("   ", [E("A")], "stream id"),
        (None, [E("A")], "stream id"),
        ("s", [], "at least one event"),
        ("s", [E("A", {"when": datetime.now()})], "not JSON-serialisable"),
        ("s", [E("A", {"x": float("nan")})], "not JSON-serialisable"),
        ("s", [E("A", [1, 2])], "must be a JSON object"),  # type: ignore[arg-type]
        ("s", [E("A", metadata={"o": object()})], "metadata is not JSON-serialisable"),
        ("s", [E("")], "type must be a non-empty string"),
        ("s", [{"type": "A"}], "must be an el.NewEvent"),
    ],
)
def test_bad_input_is_rejected_and_writes_nothing(
    store: el.EventStore, stream_id, events, match
) -> None:
    store.append("existing", [E("Ok")])
    with pytest.raises(el.InvalidInputError, match=match):
        store.append(stream_id, events)
    assert store.head() == 1
    assert store.count() == 1


def test_multi_event_append_is_atomic(store: el.EventStore) -> None:
    # The last event is bad: none of the three may be written.
    with pytest.raises(el.InvalidInputError, match="event #2"):
        store.append("s", [E("A"), E("B"), E("C", {"bad": {1, 2}})])
    assert store.count() == 0
    assert store.append("s", [E("A"), E("B"), E("C")], expected_version=0) == [1, 2, 3]


def test_bad_read_arguments(store: el.EventStore) -> None:
    with pytest.raises(el.InvalidInputError, match="after"):
        store.read(after=-1)
    with pytest.raises(el.InvalidInputError, match="limit"):
        store.read(limit=0)
    with pytest.raises(el.InvalidInputError, match="mask"):
        store.read(segments=[(0, 2)])
    with pytest.raises(el.InvalidInputError, match="segment id"):
        store.read(segments=[(4, 3)])
    with pytest.raises(el.InvalidInputError, match="timezone-aware"):
        store.position_at(datetime(2026, 1, 1))


def test_segment_filter_runs_on_the_stored_hash(store: el.EventStore) -> None:
    streams = [f"stream-{i}" for i in range(60)]
    for s in streams:
        store.append(s, [E("A"), E("B")])
    everything = store.read(limit=10_000)
    for segs in ([(0, 0)], [(1, 1)], [(2, 3), (3, 3)], [(5, 7)], [(0, 3), (1, 3), (2, 3), (3, 3)]):
        got = store.read(limit=10_000, segments=segs)
        want = [e for e in everything if any(e.routing_hash & m == i for i, m in segs)]
        assert got == want
    # Segments over all four quarters partition the store exactly.
    quarters = [store.read(limit=10_000, segments=[(i, 3)]) for i in range(4)]
    assert sorted(e.position for q in quarters for e in q) == [e.position for e in everything]
    # Paging through one segment returns each of its events once.
    paged, after = [], 0
    while batch := store.read(after=after, limit=7, segments=[(1, 1)]):
        paged += batch
        after = batch[-1].position
    assert paged == store.read(limit=10_000, segments=[(1, 1)])


def test_position_at(store: el.EventStore) -> None:
    assert store.position_at(datetime.now(UTC)) is None
    store.append("a", [E("A1"), E("A2")])
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    store.append("b", [E("B1")])
    assert store.position_at(datetime(2000, 1, 1, tzinfo=UTC)) == 1
    assert store.position_at(middle) == 3
    assert store.position_at(datetime.now(UTC) + timedelta(seconds=5)) is None


def test_iter_events_reads_everything_in_batches(store: el.EventStore) -> None:
    for i in range(25):
        store.append(f"s{i % 4}", [E("A"), E("B")])
    got = list(store.iter_events(batch_size=7))
    assert [e.position for e in got] == list(range(1, 51))
    assert [e.position for e in store.iter_events(after=10, until=20, batch_size=3)] == list(
        range(11, 21)
    )


def test_append_inside_callers_transaction_commits_or_rolls_back_with_it(
    store: el.EventStore,
) -> None:
    db = store.db
    side = db.table("side_rows")
    db.run_ddl([f"CREATE TABLE IF NOT EXISTS {side} (n INTEGER NOT NULL)"])
    p = db.param
    with db.transaction() as conn:
        conn.execute(f"INSERT INTO {side} (n) VALUES ({p})", (1,))
        store.append("s", [E("A")], expected_version=0, conn=conn)
    with pytest.raises(RuntimeError), db.transaction() as conn:
        conn.execute(f"INSERT INTO {side} (n) VALUES ({p})", (2,))
        store.append("s", [E("B")], expected_version=1, conn=conn)
        raise RuntimeError("handler failed")
    assert [e.type for e in store.read()] == ["A"]
    assert db.query(f"SELECT n FROM {side}") == [(1,)]


def test_reopening_keeps_data_and_schema(store_url: str) -> None:
    with el.open_store(store_url) as s:
        s.append("a", [E("A")])
    with el.open_store(store_url) as s:
        s.append("a", [E("B")], expected_version=1)
        assert [e.version for e in s.read()] == [1, 2]


def test_bad_urls_get_clear_errors(tmp_path, pg_url: str) -> None:
    with pytest.raises(el.InvalidInputError, match="unknown store URL scheme 'mysql'"):
        el.open_store("mysql://localhost/db")
    with pytest.raises(el.InvalidInputError, match="invalid store URL"):
        el.open_store("events.db")
    with pytest.raises(el.InvalidInputError, match="invalid table prefix"):
        el.open_store(f"sqlite:///{tmp_path}/x.db?prefix=bad;drop")
    with pytest.raises(el.StoreConnectionError, match="does not exist"):
        el.open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    not_a_db = tmp_path / "text.db"
    not_a_db.write_text("this is not a database, " * 100)
    with pytest.raises(el.StoreConnectionError, match="cannot open SQLite store"):
        el.open_store(f"sqlite:///{not_a_db}")
    assert not_a_db.read_text().startswith("this is not a database")
    with pytest.raises(el.StoreConnectionError, match="connect to PostgreSQL store"):
        el.open_store("postgresql://postgres:secret@127.0.0.1:1/nodb")
    try:
        el.open_store("postgresql://postgres:secret@127.0.0.1:1/nodb")
    except el.StoreConnectionError as exc:
        assert "secret" not in str(exc)
