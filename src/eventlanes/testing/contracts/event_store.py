"""The event store contract: what every backend must do, as a pytest suite to subclass.

Usage (a test module of your own, collected by pytest)::

    from eventlanes.testing.contracts.event_store import EventStoreContract

    class TestMyStore(EventStoreContract):
        def create_store(self) -> el.EventStore:
            return el.open_store("mybackend://...")  # fresh and empty, every call

``create_store`` may use fixtures the subclass stored on ``self`` from an autouse fixture.
Every test gets a store from :meth:`EventStoreContract.create_store` and closes it. The suite
needs pytest; it uses threads (not processes), so it also runs against a backend object that
cannot be reopened by URL.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zlib import crc32

import pytest

from ...errors import ConcurrencyError, InvalidInputError
from ...events import Event, NewEvent
from ...hashing import stable_hash
from ...store import EventStore

E = NewEvent


class EventStoreContract(ABC):
    """Subclass (with a name pytest collects, ``Test...``) and implement :meth:`create_store`."""

    @abstractmethod
    def create_store(self) -> EventStore:
        """A new, empty store (its own database, file or table prefix)."""

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        store = self.create_store()
        try:
            yield store
        finally:
            store.close()

    # -- appending and expected versions ---------------------------------------------------
    def test_append_and_read_round_trip(self, store: EventStore) -> None:
        before = datetime.now(UTC) - timedelta(seconds=1)
        data = {"size": 20, "nested": {"list": [1, 2.5, None, True]}, "text": "Grüße ✓"}
        positions = store.append(
            "user-carlo", [E("FrontWheelAdded", data, metadata={"by": "test"})], expected_version=0
        )
        assert positions == [1]
        [event] = store.read(after=0)
        assert (event.position, event.stream_id, event.version) == (1, "user-carlo", 1)
        assert event.type == "FrontWheelAdded"
        assert event.data == data and event.metadata == {"by": "test"}
        assert event.corrupt is None
        assert event.routing_hash == crc32(b"user-carlo") == stable_hash("user-carlo")
        assert event.recorded_at.tzinfo is not None
        assert before <= event.recorded_at <= datetime.now(UTC) + timedelta(seconds=1)
        assert event.idempotency_key == ("user-carlo", 1)
        # Handlers share events: their fields are read-only.
        for attr in ("position", "stream_id", "type", "data", "metadata", "source", "extra"):
            with pytest.raises(AttributeError):
                setattr(event, attr, "changed")
        assert event.position == 1 and event.data == data

    def test_integers_beyond_64_bits_round_trip_exactly(self, store: EventStore) -> None:
        big = {"big": 2**70, "negative": -(2**65), "u64": 2**64, "nested": [{"n": 10**30}]}
        store.append("s", [E("Big", big, metadata={"id": 2**80})])
        for event in (store.read()[0], store.read_stream("s")[0], store.read_upto(0, 10)[0][0]):
            assert event.data == big and type(event.data["big"]) is int
            assert event.metadata == {"id": 2**80}

    def test_values_read_back_equal_and_of_the_same_type(self, store: EventStore) -> None:
        # PostgreSQL's jsonb writes numbers without an exponent: a float from 1e16 up, stored
        # as JSON text like 1e+300, would come back as an integer (not even an equal one).
        data = {
            "huge": 1e300, "f16": 1e16, "f20": 1.2345678901234568e20, "max": 1.7976931348623157e308,
            "neg": -2.5e200, "tiny": 5e-324, "small": 2.5e-08, "half": 0.5, "one": 1.0,
            "text": "1e+300 stays a string", "int": 10**20, "flag": True, "none": None,
            "nested": [{"f": 3e100}, [1e17]],
        }  # fmt: skip
        store.append("s", [E("Floats", data, metadata={"at": 1.5e18})])
        for event in (store.read()[0], store.read_stream("s")[0], store.read_upto(0, 10)[0][0]):
            assert event.data == data and event.metadata == {"at": 1.5e18}
            assert {k: type(v) for k, v in event.data.items()} == {
                k: type(v) for k, v in data.items()
            }
            assert type(event.data["nested"][0]["f"]) is float
            assert type(event.data["nested"][1][0]) is float
            assert type(event.metadata["at"]) is float

    def test_positions_and_versions(self, store: EventStore) -> None:
        assert store.head() == 0 and store.count() == 0
        assert store.append("a", [E("A1"), E("A2")], expected_version=0) == [1, 2]
        assert store.append("b", [E("B1")]) == [3]
        assert store.append("a", [E("A3")], expected_version=2) == [4]
        assert store.head() == 4 and store.count() == 4 and store.count(until=2) == 2
        assert [(e.stream_id, e.version) for e in store.read()] == [
            ("a", 1),
            ("a", 2),
            ("b", 1),
            ("a", 3),
        ]
        assert store.stream_version("a") == 3
        assert store.stream_version("missing") == 0

    def test_committed_head_and_read_wait_when_nothing_is_in_flight(
        self, store: EventStore
    ) -> None:
        assert store.committed_head() == 0 and store.read_wait() is None
        store.append("a", [E("A"), E("B")])
        assert store.committed_head() == store.head() == 2
        assert store.read_wait() is None  # readers miss nothing committed

    def test_wrong_expected_version_names_everything_and_writes_nothing(
        self, store: EventStore
    ) -> None:
        store.append("user-carlo", [E("A"), E("B")], expected_version=0)
        with pytest.raises(ConcurrencyError) as info:
            store.append("user-carlo", [E("C"), E("D")], expected_version=1)
        err = info.value
        assert (err.stream_id, err.expected, err.actual) == ("user-carlo", 1, 2)
        assert "user-carlo" in str(err) and "1" in str(err) and "2" in str(err)
        with pytest.raises(ConcurrencyError):
            store.append("user-carlo", [E("C")], expected_version=0)
        with pytest.raises(ConcurrencyError):
            store.append("new-stream", [E("C")], expected_version=3)
        assert store.head() == 2
        assert store.stream_version("user-carlo") == 2
        assert store.stream_version("new-stream") == 0
        assert store.append("user-carlo", [E("C")], expected_version=2) == [3]

    def test_multi_event_append_is_atomic(self, store: EventStore) -> None:
        with pytest.raises(InvalidInputError, match="event #2"):
            store.append("s", [E("A"), E("B"), E("C", {"bad": {1, 2}})])
        assert store.count() == 0
        assert store.append("s", [E("A"), E("B"), E("C")], expected_version=0) == [1, 2, 3]

    def test_append_inside_callers_transaction_commits_or_rolls_back_with_it(
        self, store: EventStore
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

    def test_append_runs_appends_each_run_in_order_in_the_callers_transaction(
        self, store: EventStore
    ) -> None:
        store.append("a", [E("A0")])
        runs = [("a", [E("A1"), E("A2")]), ("b", [E("B1")]), ("a", [E("A3")]), ("c", [E("C1")])]
        with store.db.transaction(pipeline=True) as conn:
            assert store.append_runs(runs, conn=conn) == 5
        assert [(e.position, e.stream_id, e.version, e.type) for e in store.read()] == [
            (1, "a", 1, "A0"), (2, "a", 2, "A1"), (3, "a", 3, "A2"), (4, "b", 1, "B1"),
            (5, "a", 4, "A3"), (6, "c", 1, "C1"),
        ]  # fmt: skip
        # A bad event in a later run: refused before anything is sent, the caller's
        # transaction rolls back whole.
        bad = [("d", [E("D1")]), ("e", [E("E1", {1: "x"})])]  # type: ignore[dict-item]
        refused = pytest.raises(InvalidInputError, match=r"event #0 \(E1\) data: key 1")
        with refused, store.db.transaction(pipeline=True) as conn:
            store.append_runs(bad, conn=conn)
        with pytest.raises(RuntimeError), store.db.transaction(pipeline=True) as conn:
            store.append_runs([("f", [E("F1")]), ("g", [E("G1")])], conn=conn)
            raise RuntimeError("the caller failed after the runs were sent")
        assert store.head() == 6
        assert [store.stream_version(s) for s in "defg"] == [0, 0, 0, 0]

    # -- bad input: refused before anything is written ---------------------------------------
    @pytest.mark.parametrize(
        "stream_id, events, expected_version, match",
        [
            ("", [E("A")], None, "stream id"),
            ("   ", [E("A")], None, "stream id"),
            (None, [E("A")], None, "stream id"),
            ("s", [], None, "append to stream 's' needs at least one event"),
            ("s", [E("A", {"when": datetime.now()})], None, "not JSON-serialisable"),
            ("s", [E("A", {"x": float("nan")})], None, "not JSON-serialisable"),
            ("s", [E("A", [1, 2])], None, "must be a JSON object"),  # type: ignore[arg-type]
            ("s", [E("A", metadata={"o": object()})], None,
             r'metadata\["o"\]: object is not JSON-serialisable'),
            # Values JSON would not give back equal: refused with where they are.
            ("s", [E("A", {1: "a", "1": "b"})], None,  # type: ignore[dict-item]
             r"event #0 \(A\) data: key 1 is not a string .*also a key there"),
            ("s", [E("A", {"items": [0, 1, 2, {1: "x"}]})], None,
             r'event #0 \(A\) data\["items"\]\[3\]: key 1 is not a string \(JSON would store it '
             r'as "1"\)'),
            ("s", [E("A", {"point": (1, 2)})], None, r'data\["point"\]: a tuple would read back'),
            ("s", [E("A", {True: 1})], None, r'data: key True is not a string.*"true"'),  # type: ignore[dict-item]
            ("s", [E("A", {None: 1})], None, r'data: key None is not a string.*"null"'),  # type: ignore[dict-item]
            ("s", [E("A", {1.5: 1})], None, r'data: key 1.5 is not a string.*"1.5"'),  # type: ignore[dict-item]
            ("s", [E("A"), E("B", metadata={"m": {2: 0}})], None,
             r'event #1 \(B\) metadata\["m"\]: key 2 is not a string'),
            ("s", [E("")], None, "type must be a non-empty string"),
            ("s", [{"type": "A"}], None, "must be an el.NewEvent"),
            # PostgreSQL cannot store NUL; refused on every backend for the same behaviour.
            ("s", [E("A", {"text": "a\x00b"})], None, r"event #0 \(A\) data.*NUL"),
            ("s", [E("A", {"k\x00": 1})], None, r"event #0 \(A\) data.*NUL"),
            ("s", [E("A"), E("B", metadata={"m": ["\x00"]})], None, r"#1 \(B\) metadata.*NUL"),
            ("s\x00", [E("A")], None, "stream id.*NUL"),
            ("s", [E("A\x00")], None, "type.*NUL"),
            ("s", [E("A", {"text": "\ud800"})], None, r"event #0 \(A\) data.*surrogate"),
            ("s", [E("A", {"\udfff": 1})], None, r"event #0 \(A\) data.*surrogate"),
            ("s\udc80", [E("A")], None, "stream id.*surrogate"),
            ("s", [E("\ud800")], None, "type.*surrogate"),
            ("s", [E("A")], 2**63, r"expected_version.*2\*\*63"),
            ("s", [E("A")], -1, "expected_version"),
        ],
    )  # fmt: skip
    def test_bad_input_is_refused_and_stored_data_stays_intact(
        self,
        store: EventStore,
        stream_id: Any,
        events: Any,
        expected_version: int | None,
        match: str,
    ) -> None:
        store.append("s", [E("Ok", {"literal": "\\u0000 is fine as text"})])
        with pytest.raises(InvalidInputError, match=match):
            store.append(stream_id, events, expected_version=expected_version)
        assert store.head() == 1 and store.count() == 1
        assert store.read()[0].data == {"literal": "\\u0000 is fine as text"}
        assert store.append("s", [E("Next")], expected_version=1) == [2]

    def test_bad_read_arguments(self, store: EventStore) -> None:
        for call, match in [
            (lambda: store.read(after=-1), "after"),
            (lambda: store.read(limit=0), "limit"),
            (lambda: store.read(segments=[(0, 2)]), "mask"),
            (lambda: store.read(segments=[(4, 3)]), "segment id"),
            (lambda: store.position_at(datetime(2026, 1, 1)), "timezone-aware"),
            (lambda: store.read(after=2**63), r"2\*\*63"),
            (lambda: store.read(limit=2**63), r"2\*\*63"),
            (lambda: store.read_stream("s", after_version=2**63), r"2\*\*63"),
            (lambda: store.read_upto(2**63, 10), r"2\*\*63"),
            (lambda: store.count(until=2**64), r"2\*\*63"),
        ]:
            with pytest.raises(InvalidInputError, match=match):
                call()

    # -- reading ----------------------------------------------------------------------------
    def test_read_order_after_and_limit(self, store: EventStore) -> None:
        for i in range(10):
            store.append(f"s{i % 3}", [E("A", {"i": i})])
        assert [e.data["i"] for e in store.read()] == list(range(10))
        assert [e.position for e in store.read(after=2, limit=3)] == [3, 4, 5]
        assert [e.position for e in store.read(after=8, limit=5)] == [9, 10]
        assert store.read(after=10) == []
        assert store.read(after=1000) == []

    def test_read_upto_says_how_far_the_read_is_complete(self, store: EventStore) -> None:
        assert store.read_upto(0, 10) == ([], 0)
        store.append("a", [E("A")] * 5)
        events, upto = store.read_upto(0, 3)
        assert [e.position for e in events] == [1, 2, 3] and upto == 3
        events, upto = store.read_upto(3, 10)
        assert [e.position for e in events] == [4, 5] and upto == 5
        # No event of the segment in the range: the read is still complete up to the head.
        other = [(1 - (stable_hash("a") & 1), 1)]
        assert store.read_upto(0, 10, other) == ([], 5)

    def test_segment_filter_runs_on_the_stored_hash(self, store: EventStore) -> None:
        for s in [f"stream-{i}" for i in range(60)]:
            store.append(s, [E("A"), E("B")])
        everything = store.read(limit=10_000)
        for segs in ([(0, 0)], [(1, 1)], [(2, 3), (3, 3)], [(5, 7)], [(i, 3) for i in range(4)]):
            got = store.read(limit=10_000, segments=segs)
            want = [e for e in everything if any(e.routing_hash & m == i for i, m in segs)]
            assert got == want
        quarters = [store.read(limit=10_000, segments=[(i, 3)]) for i in range(4)]
        assert sorted(e.position for q in quarters for e in q) == [e.position for e in everything]
        paged, after = [], 0
        while batch := store.read(after=after, limit=7, segments=[(1, 1)]):
            paged += batch
            after = batch[-1].position
        assert paged == store.read(limit=10_000, segments=[(1, 1)])

    def test_read_stream(self, store: EventStore) -> None:
        store.append("a", [E("A1"), E("A2")])
        store.append("b", [E("B1")])
        store.append("a", [E("A3")])
        assert [e.type for e in store.read_stream("a")] == ["A1", "A2", "A3"]
        assert [e.type for e in store.read_stream("a", after_version=1)] == ["A2", "A3"]
        assert [e.type for e in store.read_stream("a", after_version=1, limit=1)] == ["A2"]
        assert store.read_stream("missing") == []

    def test_read_stream_backwards(self, store: EventStore) -> None:
        store.append("a", [E("A1"), E("A2")])
        store.append("b", [E("B1")])
        store.append("a", [E("A3")])
        assert [e.type for e in store.read_stream("a", backwards=True)] == ["A3", "A2", "A1"]
        [last] = store.read_stream("a", backwards=True, limit=1)
        assert (last.type, last.version, last.position) == ("A3", 3, 4)
        page = store.read_stream("a", backwards=True, limit=2, until_version=2)
        assert [e.version for e in page] == [2, 1]
        assert [e.version for e in store.read_stream("a", after_version=1, until_version=2)] == [2]
        assert store.read_stream("missing", backwards=True, limit=1) == []

    def test_type_filter(self, store: EventStore) -> None:
        kinds = ["Placed", "Paid", "Shipped"]
        for i in range(30):
            store.append(f"order-{i % 7}", [E(kinds[i % 3], {"i": i})])
        everything = store.read(limit=100)
        for types in (["Paid"], ["Placed", "Shipped"], ["Paid", "Paid"], ["Unknown"]):
            want = [e for e in everything if e.type in types]
            assert store.read(limit=100, types=types) == want
            assert list(store.iter_events(batch_size=4, types=types)) == want
        paid = [e.position for e in everything if e.type == "Paid"]
        assert [e.position for e in store.read(after=paid[2], limit=3, types=("Paid",))] == (
            paid[3:6]
        )
        segment = [(1, 1)]
        want = [e for e in everything if e.type == "Paid" and e.routing_hash & 1 == 1]
        assert store.read(limit=100, segments=segment, types=["Paid"]) == want
        for bad in ([], [""], "Paid", [None]):
            with pytest.raises(InvalidInputError, match="types"):
                store.read(types=bad)  # type: ignore[arg-type]

    def test_read_upto_with_types_moves_past_events_of_other_types(self, store: EventStore) -> None:
        store.append("a", [E("Wanted"), E("Other"), E("Wanted")])
        store.append("b", [E("Other")] * 4)  # the newest events are of another type
        events, upto = store.read_upto(0, 10, types=["Wanted"])
        assert [e.position for e in events] == [1, 3]
        assert upto == 7  # complete up to the head: a processor here is not lagging
        assert store.read_upto(upto, 10, types=["Wanted"]) == ([], 7)
        events, upto = store.read_upto(0, 1, types=["Wanted"])  # a full batch: its last event
        assert [e.position for e in events] == [1] and upto == 1
        events, upto = store.read_upto(1, 1, types=["Wanted"])
        assert [e.position for e in events] == [3] and upto == 3

    def test_iter_events_and_scan_read_everything_in_batches(self, store: EventStore) -> None:
        for i in range(25):
            store.append(f"s{i % 4}", [E("A"), E("B")])
        assert [e.position for e in store.iter_events(batch_size=7)] == list(range(1, 51))
        got = [e.position for e in store.iter_events(after=10, until=20, batch_size=3)]
        assert got == list(range(11, 21))
        rows = [row for chunk in store.scan(5, 40, chunk=6) for row in chunk]
        assert [Event(*row) for row in rows] == store.read(after=5, limit=35)

    def test_position_at(self, store: EventStore) -> None:
        assert store.position_at(datetime.now(UTC)) is None
        store.append("a", [E("A1"), E("A2")])
        time.sleep(0.05)
        middle = datetime.now(UTC)
        time.sleep(0.05)
        store.append("b", [E("B1")])
        assert store.position_at(datetime(2000, 1, 1, tzinfo=UTC)) == 1
        assert store.position_at(middle) == 3
        assert store.position_at(datetime.now(UTC) + timedelta(seconds=5)) is None

    # -- concurrency --------------------------------------------------------------------------
    def test_readers_see_only_committed_events(self, store: EventStore) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as other, store.db.transaction() as conn:
            store.append("a", [E("A")], conn=conn)
            assert other.submit(store.read).result() == []
            assert other.submit(store.head).result() == 0
        assert [e.type for e in store.read()] == ["A"]

    def test_concurrent_writers_are_never_skipped_by_a_tailing_reader(
        self, store: EventStore
    ) -> None:
        writers, appends = 4, 40
        streams = [f"order-{i}" for i in range(6)]  # few streams: writers overlap constantly
        written = [0] * writers
        errors: list[BaseException] = []

        def write(w: int) -> None:
            try:
                for k in range(appends):
                    events = [E("Item", {"w": w, "k": k, "i": i}) for i in range(1 + k % 3)]
                    if k % 2:
                        with store.db.transaction() as conn:  # held open while others commit
                            store.append(streams[(w + k) % 6], events, conn=conn)
                            time.sleep(0.001)
                    else:
                        store.append(streams[(w + k) % 6], events)
                    written[w] += len(events)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        seen: list[Event] = []
        after = upto_after = 0
        upto_seen: list[int] = []
        while any(t.is_alive() for t in threads):
            batch = store.read(after=after, limit=25)
            seen += batch
            after = batch[-1].position if batch else after
            events, upto_after = store.read_upto(upto_after, 25)
            upto_seen += [e.position for e in events]
        for t in threads:
            t.join()
        assert not errors, errors
        seen += store.read(after=after, limit=100_000)
        while True:  # the read_upto reader catches up too
            events, new_upto = store.read_upto(upto_after, 1000)
            upto_seen += [e.position for e in events]
            if new_upto == upto_after:
                break
            upto_after = new_upto
        positions = [e.position for e in seen]
        assert positions == sorted(set(positions)), "reader went backwards or saw a duplicate"
        final = [e.position for e in store.read(limit=100_000)]
        assert len(final) == sum(written)
        assert positions == final, "the tailing reader skipped committed events"
        assert upto_seen == final, "the read_upto reader skipped committed events"
        by_stream: dict[str, list[int]] = {}
        for event in seen:
            by_stream.setdefault(event.stream_id, []).append(event.version)
        for stream, versions in by_stream.items():
            assert versions == list(range(1, len(versions) + 1)), f"{stream} out of order"
