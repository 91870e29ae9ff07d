"""Input errors named as such (issue 30, items 8-11 and 14): numeric options that are not finite
and positive, ids too long for an index, NUL in keys and types, SQLite lock waits, and token
rows whose detail cannot be decoded. Real databases on both backends; nothing mocked."""

from __future__ import annotations

import logging
import math
import re
import sqlite3
import threading
import time

import pytest

import eventlanes as el
from eventlanes.db.weather import is_transient
from eventlanes.tokens import claims

E = el.NewEvent

BAD_NUMBERS = [math.nan, math.inf, -math.inf, -5, 0, True, "1", 1e300]


# -- item 9: numeric options are finite and positive -------------------------------------------
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("option", ["claim_timeout", "poll_interval"])
def test_app_refuses_seconds_that_are_not_finite_and_positive(
    store_url: str, option: str, value: object
) -> None:
    with pytest.raises(el.InvalidInputError, match=rf"{option}.*got {re.escape(repr(value))}"):
        el.App(store_url, **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_token_stores_refuse_a_claim_timeout_that_is_not_finite_and_positive(
    store_url: str, value: object
) -> None:
    with pytest.raises(el.InvalidInputError, match="claim_timeout"):
        el.open_token_store(store_url, claim_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(el.InvalidInputError, match="claim_timeout"):
        el.InMemoryTokenStore(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_handler_timeout_is_finite_and_positive(store_url: str, value: object) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match=r"handler_timeout.*got"):
        app.processor("p", handler_timeout=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["max_segments", "workers", "batch_size", "lanes"])
@pytest.mark.parametrize("value", [True, 0, -1, 1.5, math.nan])
def test_counts_are_whole_numbers_from_one(store_url: str, option: str, value: object) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match=rf"{option} must be >= 1"):
        app.processor("p", **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, True])
def test_persist_every_is_finite_and_not_negative(store_url: str, value: object) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match="persist_every"):
        app.aggregation("a", key="k", initial=dict, persist_every=value)  # type: ignore[arg-type]


def test_a_negative_sqlite_busy_timeout_is_refused(tmp_path) -> None:
    with pytest.raises(el.InvalidInputError, match=r"busy_timeout.*-5"):
        el.open_store(f"sqlite:///{tmp_path}/events.db?busy_timeout=-5")


def test_good_seconds_still_pass(store_url: str) -> None:
    app = el.App(store_url, claim_timeout=2, poll_interval=0.5)
    assert (app.claim_timeout, app.poll_interval) == (2.0, 0.5)
    app.processor("p", handler_timeout=1)


# -- item 10: ids too long for an index, permanent PostgreSQL errors ---------------------------
def test_a_huge_stream_id_is_refused_as_input_on_both_backends(store: el.EventStore) -> None:
    store.append("kept", [E("T")])
    with pytest.raises(el.InvalidInputError, match=r"stream id .*1,024 bytes"):
        store.append("x" * 10_000_000, [E("T")])
    with pytest.raises(el.InvalidInputError, match=r"type .*1,024 bytes"):
        store.append("s", [E("T" * 1025)])
    # At the limit (multi-byte characters count as bytes): stored and read back alike.
    longest = "é" * 512
    store.append(longest, [E(longest)])
    assert [e.type for e in store.read_stream(longest)] == [longest]
    assert store.head() == 2


def test_permanent_postgres_errors_are_input_errors_not_outages(pg_url: str) -> None:
    from eventlanes.db import open_database

    db = open_database(pg_url)
    try:
        huge = pytest.raises(el.InvalidInputError, match="index row requires")
        with huge as caught, db.guard("insert a huge key"), db.connection() as conn:
            conn.execute("CREATE TEMP TABLE big (k text PRIMARY KEY)")
            conn.execute(
                "INSERT INTO big SELECT string_agg(md5(i::text), '') "
                "FROM generate_series(1, 2000) AS i"
            )
        assert not isinstance(caught.value, el.DatabaseUnavailableError)
        assert caught.value.__cause__ is not None and not is_transient(caught.value.__cause__)
        zero = pytest.raises(el.InvalidInputError, match="division by zero")
        with zero, db.guard("divide"), db.connection() as conn:
            conn.execute("SELECT 1 / 0")
    finally:
        db.close()


# -- item 11: NUL in keys and types -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["on", "on_batch", "aggregation", "republisher"])
def test_a_handler_type_with_nul_is_refused_at_definition(store_url: str, kind: str) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match="NUL"):
        if kind == "on":
            app.processor("p").on("A\x00B")
        elif kind == "on_batch":
            app.processor("p").on_batch("A\x00B")
        elif kind == "aggregation":
            app.aggregation("a", key="k", initial=dict).on("A\x00B")
        else:
            app.republisher("r", to_stream="out").on("A\x00B")


def test_a_dead_letter_key_with_nul_is_refused_naming_the_event(store_url: str) -> None:
    app = el.App(store_url)
    app.migrate()
    app.store.append("s", [E("T")])
    event = app.store.read(0, 1)[0]
    refused = pytest.raises(el.InvalidInputError, match=r"NUL.*position 1|position 1.*NUL")
    with refused, app.db.transaction() as conn:
        app.runtime.dead_letters.park(conn, "p", event, "a\x00b", 0, "boom")
    assert app.runtime.dead_letters.count("p") == 0


# -- item 14: SQLite lock waits named as such ---------------------------------------------------
def test_a_sqlite_lock_wait_is_named_and_not_a_warning(
    tmp_path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.db"
    app = el.App(f"sqlite:///{path}")
    app.migrate()
    tokens = app.runtime.tokens
    tokens.initialize("p", segments=1, store=app.store)
    assert tokens.claim("p", 0, "me") is not None
    monkeypatch.setattr(claims, "HANG_AFTER", 0.3)  # the other writer's lock: 1.5 s, not 5
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another worker's batch holds the write lock
    release = threading.Timer(1.5, lambda: other.execute("COMMIT"))
    caplog.set_level(logging.DEBUG, logger="eventlanes")
    beat = claims.Heartbeat(tokens, "p", "me", interval=60, announce=False)
    beat._watchdog.start()  # noqa: SLF001 - the watchdog alone; the beat runs here
    release.start()
    try:
        assert beat.beat() == {0}
    finally:
        beat.stop()
        release.join()
        other.close()
    said = [r for r in caplog.records if r.name.startswith("eventlanes")]
    assert any(f"waiting for another writer's lock on {path}" in r.getMessage() for r in said)
    assert not [r.getMessage() for r in said if r.levelno >= logging.WARNING]


def test_a_sqlite_busy_timeout_names_the_lock(tmp_path) -> None:
    path = tmp_path / "events.db"
    store = el.open_store(f"sqlite:///{path}?busy_timeout=100")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(el.DatabaseUnavailableError, match="another writer's lock on"):
            store.append("s", [E("T")])
    finally:
        other.close()
        store.close()


# -- item 8: a token row whose detail cannot be decoded ------------------------------------------
def _corrupt(app: el.App, name: str, segment_id: int, detail: str) -> None:
    t = app.db.table("tokens")
    with app.db.transaction() as conn:
        conn.execute(
            app.db.sql(f"UPDATE {t} SET token_detail = ? WHERE processor = ? AND segment_id = ?"),
            (detail, name, segment_id),
        )


@pytest.mark.parametrize("detail", ["{broken", "[1, 2]", '{"ahead": 5}', '{"sources": {"a": 1}}'])
def test_a_corrupt_token_detail_names_the_processor_and_segment(
    store_url: str, detail: str
) -> None:
    app = el.App(store_url)
    app.migrate()
    tokens = app.runtime.tokens
    tokens.initialize("p", segments=2, store=app.store)
    _corrupt(app, "p", 1, detail)
    with pytest.raises(el.CorruptTokenError, match=r"processor 'p'.*segment 1/1") as caught:
        tokens.token("p", 1)
    with pytest.raises(el.CorruptTokenError, match=r"processor 'p'.*segment 1/1"):
        tokens.claim("p", 1, "me")
    assert isinstance(caught.value, el.InvalidInputError)
    assert (caught.value.processor, caught.value.segment) == ("p", "1/1")


def test_a_runner_stops_the_corrupt_segment_and_runs_the_others(store_url: str) -> None:
    app = el.App(store_url, claim_timeout=3)
    seen: list[str] = []
    proc = app.processor("p", segments=2)

    @proc.on("T")
    def handle(event: el.Event, ctx: el.Context) -> None:
        seen.append(event.stream_id)

    app.migrate()
    app.runtime.initialize("p", 2, "tail")
    _corrupt(app, "p", 1, "{broken")
    streams = [f"s{i}" for i in range(20)]
    for s in streams:
        app.store.append(s, [E("T")])
    on_ok = {s for s in streams if el.Segment(0, 1).matches(el.stable_hash(s))}
    app.start()
    try:
        deadline = time.monotonic() + 20
        while set(seen) != on_ok and time.monotonic() < deadline:
            time.sleep(0.1)
        rows = {s.segment.id: s for s in app.runtime.tokens.status("p")}
    finally:
        app.stop()
    assert set(seen) == on_ok  # the healthy segment ran; the corrupt one ran nothing
    assert rows[1].owner is None and "corrupt" in (rows[1].last_error or "")
    assert rows[1].errors >= 1 and rows[1].corrupt  # retried with back-off, never skipped
    t = app.db.table("tokens")
    stored = app.db.query(
        app.db.sql(
            f"SELECT position, token_detail FROM {t} WHERE processor = ? AND segment_id = 1"
        ),
        ("p",),
    )
    assert stored == [(0, "{broken")]
