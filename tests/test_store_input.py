"""Input that used to be silently wrong: exact integers, stored rows that are not JSON objects,
names with a trailing newline (values PostgreSQL cannot store and big integers through the
store: in the shipped contract)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import eventlanes as el
from eventlanes.db import validate_prefix
from eventlanes.errors import CorruptEventError
from eventlanes.names import validate_processor_name

E = el.NewEvent


def test_event_decodes_big_integers_exactly_from_stored_text() -> None:
    raw = '{"a": 123456789012345678901234567890, "b": -99999999999999999999, "c": 1}'
    event = el.Event(1, "s", 1, "T", raw, "{}", 0, 0)
    assert event.data == {"a": 123456789012345678901234567890, "b": -99999999999999999999, "c": 1}


def _insert_raw(store: el.EventStore, stream: str, version: int, data: Any, meta: Any) -> None:
    """A row written behind the store's back (another tool, an old bug, a manual fix)."""
    t = store.events_table
    if store.db.backend == "sqlite":
        with store.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO {t} (position, stream_id, version, type, data, metadata, "
                f"recorded_at, routing_hash) VALUES ((SELECT coalesce(max(position), 0) + 1 "
                f"FROM {t}), ?, ?, 'Raw', {data}, {meta}, 0, ?)",
                (stream, version, el.stable_hash(stream)),
            )
    else:
        with store.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO {t} (position, stream_id, version, type, data, metadata, "
                f"routing_hash) VALUES (nextval('{t}_position_seq'), %s, %s, 'Raw', "
                f"{data}::jsonb, {meta}::jsonb, %s)",
                (stream, version, el.stable_hash(stream)),
            )


BAD_ROWS = {
    "sqlite": [
        ("''", "'{}'", "data.*not a JSON object"),
        ("'null'", "'{}'", "data.*not a JSON object.*null"),
        ("'[1, 2]'", "'{}'", "data.*not a JSON object.*list"),
        ("'{}'", "'\"text\"'", "metadata.*not a JSON object"),
        ("'{broken'", "'{}'", "data.*not valid JSON"),
        ("CAST(x'7b22ff223a317d' AS TEXT)", "'{}'", "not valid UTF-8"),
        ("'{}'", "CAST(x'ff' AS TEXT)", "not valid UTF-8"),
    ],
    "postgresql": [
        ("'null'", "'{}'", "data.*not a JSON object.*null"),
        ("'[1, 2]'", "'{}'", "data.*not a JSON object.*list"),
        ("'{}'", "'\"text\"'", "metadata.*not a JSON object"),
        ("'42'", "'{}'", "data.*not a JSON object"),
    ],
}


def test_a_stored_row_that_is_not_a_json_object_fails_alone(store: el.EventStore) -> None:
    for i, (data, meta, reason) in enumerate(BAD_ROWS[store.db.backend]):
        good = store.append(f"good-{i}", [E("Good", {"i": i})])[0]
        _insert_raw(store, f"bad-{i}", 1, data, meta)
        bad = good + 1
        reads = {
            "read": store.read(after=good - 1),
            "read_upto": store.read_upto(good - 1, 100)[0],
            "iter_events": list(store.iter_events(after=good - 1)),
            "read_stream": [*store.read_stream(f"good-{i}"), *store.read_stream(f"bad-{i}")],
        }
        for how, events in reads.items():
            assert [e.position for e in events] == [good, bad], how
            ok, corrupt = events
            assert ok.data == {"i": i} and ok.corrupt is None
            # Routing fields stay usable, so only this event's key needs to stop.
            assert (corrupt.stream_id, corrupt.version, corrupt.type) == (f"bad-{i}", 1, "Raw")
            assert corrupt.corrupt is not None
            with pytest.raises(CorruptEventError, match=reason) as info:
                _ = corrupt.data, corrupt.metadata
            assert info.value.position == bad
            assert f"position {bad}" in str(info.value)
            assert "corrupt=" in repr(corrupt)  # logging it does not raise
            # Worker processes receive events pickled: still the same corrupt event there.
            copy = pickle.loads(pickle.dumps(corrupt))
            assert copy.corrupt == corrupt.corrupt and copy.stream_id == corrupt.stream_id


def test_invalid_utf8_in_routing_fields_does_not_fail_the_read(tmp_path) -> None:
    store = el.open_store(f"sqlite:///{tmp_path}/events.db")
    store.append("before", [E("A")])
    with store.db.transaction() as conn:
        conn.execute(
            "INSERT INTO el_events VALUES (2, CAST(x'61ff' AS TEXT), 1, 'T', '{}', '{}', 0, 7)"
        )
    store.append("after", [E("B")])
    events = store.read()
    assert [e.position for e in events] == [1, 2, 3]
    assert events[1].routing_hash == 7 and events[1].corrupt is not None
    with pytest.raises(CorruptEventError, match="position 2.*stream_id.*UTF-8"):
        _ = events[1].data
    with pytest.raises(CorruptEventError, match="position 2"):
        list(store.scan(0, 3))
    store.close()


@pytest.mark.parametrize("name", ["x\n", "ok\n", "a\nb", ""])
def test_processor_names_are_matched_whole(name: str) -> None:
    with pytest.raises(el.InvalidInputError, match="invalid processor name"):
        validate_processor_name(name)


@pytest.mark.parametrize("prefix", ["el_\n", "x\n", "a\nb"])
def test_table_prefixes_are_matched_whole(prefix: str, tmp_path) -> None:
    with pytest.raises(el.InvalidInputError, match="invalid table prefix"):
        validate_prefix(prefix)
    with pytest.raises(el.InvalidInputError, match="invalid table prefix"):
        el.open_store(f"sqlite:///{tmp_path}/x.db?prefix={prefix.replace(chr(10), '%0A')}")
