"""Silent defects the speed work could bring: the pooled read-ahead and per-segment batch cut,
the cursor ``ctx.execute`` reuses, ``ctx.insert_rows`` (COPY on PostgreSQL), the pipelined read
and commit, ``wait_until_caught_up`` and the dispatch fast paths. Real databases and threads."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import eventlanes as el
from tests.processing_helpers import context_in, run_until_caught_up, serial_pk, wait_for

E = el.NewEvent


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


# -- Context.execute: the reused cursor ------------------------------------------------------


def test_a_cursor_the_handler_closed_is_not_used_again(store_url: str) -> None:
    """A handler that closes the cursor ``ctx.execute`` gave it (tidy DB-API code, or psycopg's
    ``with ctx.execute(...) as cur``) must not break the next statement of the batch: the
    reused cursor is closed, so the next event's handler fails (parked here, in dead-letter
    mode, though nothing is wrong with it)."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("closing", segments=1, batch_size=50, on_error="dead_letter")
    table = app.db.table("closing_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT, before BIGINT)"])
    p = app.db.param
    counts: list[int] = []

    @proc.on("Step")
    def step(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", (event.position, 0))
        cur = ctx.execute(f"SELECT count(*) FROM {table}")  # the last statement: reused next
        counts.append(cur.fetchone()[0])
        cur.close()

    for i in range(6):  # a key each: a parked event holds back only its own key
        app.store.append(f"s-{i}", [E("Step")])
    run_until_caught_up(app, 20)
    rows = app.db.query(f"SELECT position FROM {table} ORDER BY position")
    parked = [(d.position, d.error) for d in app.dead_letter_list("closing")]
    app.close()
    assert parked == []
    assert [r[0] for r in rows] == list(range(1, 7))


def test_a_cursor_being_iterated_keeps_its_rows_across_later_statements(store_url: str) -> None:
    """Iterating over a cursor (a for loop, a generator over it) while executing other
    statements: the cursor being iterated is held, so it is never the one reused."""
    app = el.App(store_url)
    table = app.db.table("iterated")
    app.db.run_ddl([f"CREATE TABLE {table} (n BIGINT)"])
    p = app.db.param
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        for n in range(5):
            ctx.execute(f"INSERT INTO {table} VALUES ({p})", (n,))

        def numbers() -> Iterator[int]:
            yield from (row[0] for row in ctx.execute(f"SELECT n FROM {table} ORDER BY n"))

        seen = []
        pending = numbers()  # not started yet: it executes when first asked
        for n in pending:
            seen.append(n)
            ctx.execute(f"INSERT INTO {table} VALUES ({p})", (n + 100,))
            assert ctx.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 6 + len(seen) - 1
        kept = ctx.execute(f"SELECT n FROM {table} WHERE n < 100 ORDER BY n")
        first = kept.fetchone()
        ctx.execute(f"DELETE FROM {table} WHERE n >= 100")
        rest = kept.fetchall()
    app.close()
    assert seen == [0, 1, 2, 3, 4]
    assert [first[0], *(r[0] for r in rest)] == [0, 1, 2, 3, 4]


# -- Context.insert_rows: COPY must store what INSERT stores -----------------------------------

_PLUS_TWO = dt.timezone(dt.timedelta(hours=2))

# (column type, value): values a projection plausibly writes; what ``ctx.execute("INSERT ...")``
# stores is what insert_rows must store (PostgreSQL's COPY parses text instead of casting).
INSERT_CASES = {
    "uuid-into-text": ("text", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    "aware-into-timestamp": ("timestamp", dt.datetime(2026, 1, 1, 10, 0, tzinfo=_PLUS_TWO)),
    "aware-into-date": (
        "date",
        dt.datetime(2026, 1, 1, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    ),
    "bool-into-text": ("text", True),
    "float-into-text": ("text", 100.0),
}
SAME_CASES = [  # already equal: kept so that a change of the COPY path cannot break them
    ("text", "tab\there \\ back\\slash\nnew line \\N é 😀"),
    ("text", ""),
    ("text", None),
    ("bytea", b"\x00\\x\t\n\xff"),
    ("numeric", decimal.Decimal("1.10")),
    ("boolean", False),
    ("double precision", 0.1),
    ("bigint", 2**62),
    ("timestamptz", dt.datetime(2026, 1, 1, 10, 0, tzinfo=_PLUS_TWO)),
    ("text[]", ["a,b", 'c"d', None, "NULL"]),
]


def _insert_both_ways(app: el.App, column: str, value: Any) -> tuple[Any, Any]:
    table = app.db.table(f"both_{uuid.uuid4().hex[:8]}")
    app.db.run_ddl([f"CREATE TABLE {table} (k INTEGER, v {column})"])
    p = app.db.param
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        ctx.execute(f"INSERT INTO {table} (k, v) VALUES ({p}, {p})", (1, value))
        assert ctx.insert_rows(table, ["k", "v"], [(2, value)]) == 1
    cast = "v::text" if app.db.backend == "postgresql" else "v"
    rows = app.db.query(f"SELECT {cast} FROM {table} ORDER BY k")
    return rows[0][0], rows[1][0]


@pytest.mark.parametrize(("column", "value"), list(INSERT_CASES.values()), ids=list(INSERT_CASES))
def test_insert_rows_stores_what_an_insert_stores(pg_url: str, column: str, value: Any) -> None:
    app = el.App(f"{pg_url}?prefix=rv_{uuid.uuid4().hex[:8]}_")
    try:
        by_insert, by_copy = _insert_both_ways(app, column, value)
    finally:
        app.close()
    assert by_copy == by_insert, f"COPY stored {by_copy!r}, INSERT {by_insert!r}"


@pytest.mark.parametrize(
    ("column", "value"), SAME_CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(SAME_CASES)]
)
def test_insert_rows_keeps_awkward_values_as_an_insert_does(
    pg_url: str, column: str, value: Any
) -> None:
    app = el.App(f"{pg_url}?prefix=rv_{uuid.uuid4().hex[:8]}_")
    try:
        by_insert, by_copy = _insert_both_ways(app, column, value)
    finally:
        app.close()
    assert by_copy == by_insert


def test_insert_rows_of_the_event_time_in_a_session_not_on_utc(pg_url: str) -> None:
    """``event.recorded_at`` (aware, UTC) into a ``timestamp`` column, on a server whose time
    zone is not UTC: INSERT stores local time, COPY the UTC wall clock."""
    app = el.App(f"{pg_url}?prefix=rv_{uuid.uuid4().hex[:8]}_")
    table = app.db.table("event_times")
    app.db.run_ddl([f"CREATE TABLE {table} (k INTEGER, at TIMESTAMP)"])
    [position] = app.store.append("s", [E("Step")])
    [event] = app.store.read(after=position - 1, limit=1)
    try:
        with app.db.transaction() as conn:
            conn.execute("SET LOCAL TimeZone = 'America/New_York'")
            ctx = context_in(app, conn)
            ctx.execute(f"INSERT INTO {table} VALUES (1, %s)", (event.recorded_at,))
            ctx.insert_rows(table, ["k", "at"], [(2, event.recorded_at)])
        rows = app.db.query(f"SELECT at FROM {table} ORDER BY k")
    finally:
        app.close()
    assert rows[1][0] == rows[0][0]


def test_insert_rows_in_a_pipelined_processor_runs_each_batch_once(pg_url: str) -> None:
    """COPY cannot run in pipeline mode: with ``pipeline=True`` every batch that uses
    insert_rows fails its pipelined try and is handled a second time (plain); the handler
    runs twice per batch, its speed-up gone, and nothing says so."""
    app = el.App(f"{pg_url}?prefix=rv_{uuid.uuid4().hex[:8]}_", claim_timeout=2)
    proc = app.processor("bulk", segments=1, batch_size=10, pipeline=True)
    table = app.db.table("bulk_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT)"])
    calls: Counter[tuple[int, ...]] = Counter()

    @proc.on_batch("Step")
    def batch(events: list[el.Event], ctx: el.Context) -> None:
        calls[tuple(e.position for e in events)] += 1
        ctx.insert_rows(table, ["position"], [(e.position,) for e in events])

    app.store.append("s", [E("Step") for _ in range(30)])
    run_until_caught_up(app, 20)
    rows = [r[0] for r in app.db.query(f"SELECT position FROM {table} ORDER BY position")]
    app.close()
    assert rows == list(range(1, 31))
    assert set(calls.values()) == {1}, f"batches handled more than once: {dict(calls)}"


def test_insert_rows_failing_mid_copy_rolls_the_batch_back(store_url: str) -> None:
    """The rows given to insert_rows fail after some were streamed (a bad value, a generator
    that raises): nothing of the batch stays, and its retry writes each row once."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("midcopy", segments=2, batch_size=20)
    table = app.db.table("midcopy_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT NOT NULL, note TEXT)"])
    failures = {"generator": 0, "null": 0}

    @proc.on_batch("Step")
    def batch(events: list[el.Event], ctx: el.Context) -> None:
        def rows() -> Iterator[tuple[Any, ...]]:
            for i, e in enumerate(events):
                if i == 5 and failures["generator"] == 0 and e.position > 10:
                    failures["generator"] += 1
                    raise RuntimeError("the row source failed")
                yield (e.position, "x")

        ctx.insert_rows(table, ["position", "note"], rows())
        if failures["null"] == 0 and any(e.position > 30 for e in events):
            failures["null"] += 1
            ctx.insert_rows(table, ["position", "note"], [(1, "ok"), (None, "NOT NULL")])

    for j in range(12):
        app.store.append(f"s-{j % 5}", [E("Step") for _ in range(5)])
    run_until_caught_up(app, 30)
    rows = [r[0] for r in app.db.query(f"SELECT position FROM {table} ORDER BY position")]
    app.close()
    assert failures == {"generator": 1, "null": 1}
    assert rows == list(range(1, 61))


# -- the pooled loop: read-ahead, per-segment cut, segments at different positions -------------


def _key_recorder(app: el.App, proc: el.Processor, name: str) -> str:
    table = app.db.table(name)
    app.db.run_ddl(
        [
            f"CREATE TABLE IF NOT EXISTS {table} "
            f"(id {serial_pk(app.db)}, k TEXT, type TEXT, position BIGINT)"
        ]
    )
    p = app.db.param

    @proc.on("A", "B")
    def record(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(
            f"INSERT INTO {table} (k, type, position) VALUES ({p}, {p}, {p})",
            (event.data["k"], event.type, event.position),
        )

    return table


def _append_keyed(store: el.EventStore, n: int, keys: int, seed: int) -> None:
    for i in range(n):
        j = i + seed * 1000
        store.append(f"st-{j % 7}", [E("ABC"[j % 3], {"k": f"k{(j * 7 + seed) % keys}"})])


def _assert_each_once_in_key_order(app: el.App, table: str) -> int:
    rows = app.db.query(f"SELECT k, type, position FROM {table} ORDER BY id")
    counts = Counter(r[2] for r in rows)
    assert not [p for p, c in counts.items() if c > 1], "handled twice"
    wanted = {e.position for e in app.store.iter_events() if e.type in ("A", "B")}
    assert set(counts) == wanted, f"missing {sorted(wanted - set(counts))[:5]}"
    last: dict[str, int] = {}
    for k, _, position in rows:
        assert position > last.get(k, 0), f"key {k}: {position} after {last[k]}"
        last[k] = position
    return len(rows)


def test_pooled_cut_with_uneven_segments_merged_tokens_and_a_property_key(store_url: str) -> None:
    """Segments of two masks at different positions, a merged token that remembers where its
    half ahead had got, a key from the data (events of every segment read and shared here),
    types not handled in between, small batches cut per segment and read ahead, appends while
    it runs: each handled event once, in order per key."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("mix", segments=3, batch_size=7, policy=el.by_data("k"))
    table = _key_recorder(app, proc, "mix_rows")
    _append_keyed(app.store, 240, keys=11, seed=0)
    app.start(node_index=0, nodes=2)  # 0/1 and 3/3 only: 1/3 stays at the tail
    try:
        wait_for(
            lambda: all(s.caught_up for s in app.status("mix").segments if s.segment.id != 1),
            what="the held segments",
        )
    finally:
        app.stop()
    assert app.merge("mix", 3) == "merged 3/3 and 1/3 into 1/1"
    merged = [s for s in app.status("mix").segments if s.segment.id == 1][0]
    assert merged.token.ahead and merged.token.position == 0
    _append_keyed(app.store, 60, keys=11, seed=1)
    stop = threading.Event()

    def keep_appending() -> None:
        seed = 2
        while not stop.wait(0.02) and seed < 12:
            _append_keyed(app.store, 10, keys=11, seed=seed)
            seed += 1

    writer = threading.Thread(target=keep_appending)
    app.start()
    writer.start()
    try:
        time.sleep(0.3)
        stop.set()
        writer.join()
        app.wait_until_caught_up(60)
    finally:
        stop.set()
        app.stop()
    handled = _assert_each_once_in_key_order(app, table)
    app.close()
    assert handled > 200


def test_pooled_read_ahead_across_a_steal_never_hands_out_a_batch_twice(store_url: str) -> None:
    """Two nodes in one process, the second started while the first is busy (it gives up
    segments, read-ahead batches included): every event once, in order per key."""
    app_a = el.App(store_url, claim_timeout=2)
    app_b = el.App(store_url, claim_timeout=2)
    options: dict[str, Any] = {"segments": 4, "batch_size": 5, "policy": el.by_data("k")}
    table = _key_recorder(app_a, app_a.processor("shared", **options), "rows")
    _key_recorder(app_b, app_b.processor("shared", **options), "rows")
    _append_keyed(app_a.store, 400, keys=9, seed=0)
    app_a.start()
    try:
        time.sleep(0.2)
        app_b.start()
        _append_keyed(app_a.store, 60, keys=9, seed=3)
        app_a.wait_until_caught_up(60)
        app_b.wait_until_caught_up(60)
    finally:
        app_b.stop()
        app_a.stop()
    _assert_each_once_in_key_order(app_a, table)
    app_a.close()
    app_b.close()


# -- wait_until_caught_up ------------------------------------------------------------------


def _halves(url: str, gate: threading.Event | None) -> tuple[el.App, str]:
    app = el.App(url, claim_timeout=2)
    proc = app.processor("halves", segments=2, batch_size=10)
    table = app.db.table("halves_rows")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (position BIGINT)"])
    p = app.db.param

    @proc.on_any
    def record(event: el.Event, ctx: el.Context) -> None:
        if gate is not None:
            gate.wait(10)
        ctx.execute(f"INSERT INTO {table} VALUES ({p})", (event.position,))

    return app, table


def test_wait_until_caught_up_waits_for_segments_another_node_holds(store_url: str) -> None:
    """This node's own segment is at the head; the other node's is not (slow handler):
    waiting must not return until it is."""
    gate = threading.Event()
    fast, table = _halves(store_url, None)
    slow, _ = _halves(store_url, gate)
    for i in range(40):
        fast.store.append(f"s-{i}", [E("Step")])
    fast.start(node_index=0, nodes=2)
    slow.start(node_index=1, nodes=2)
    released = threading.Timer(1.0, gate.set)
    released.start()
    try:
        fast.wait_until_caught_up(30, ["halves"])
        assert gate.is_set(), "returned while the other node's segment was still behind"
        done = {r[0] for r in fast.db.query(f"SELECT position FROM {table}")}
        assert done == set(range(1, 41))
    finally:
        gate.set()
        released.cancel()
        slow.stop()
        fast.stop()
    fast.close()
    slow.close()


def test_wait_until_caught_up_returns_after_a_split_while_running(store_url: str) -> None:
    """A split while running gives a new segment, held or not yet held here: the wait returns
    once both halves are at the head, and not before (the new half starts behind)."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("splitting", segments=1, batch_size=20)
    table = app.db.table("splitting_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT)"])
    p = app.db.param

    @proc.on_any
    def record(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"INSERT INTO {table} VALUES ({p})", (event.position,))

    for i in range(50):
        app.store.append(f"s-{i}", [E("Step")])
    app.start()
    try:
        app.wait_until_caught_up(30)
        app.split("splitting", 0)
        for i in range(50):
            app.store.append(f"s-{i}", [E("Step")])
        app.wait_until_caught_up(30)
        done = sorted(r[0] for r in app.db.query(f"SELECT position FROM {table}"))
        assert done == list(range(1, 101))
        assert all(s.position >= 100 for s in app.status("splitting").segments)
    finally:
        app.stop()
    app.close()


# -- PostgreSQL: the pipelined read with several types and segments ---------------------------


def test_typed_segment_reads_wait_for_an_append_in_flight_below_them(pg_url: str) -> None:
    """A processor reading two of three types (one index walk per type, merged) for two
    segments: an append of a handled type still in flight below later committed events holds
    the token back; once it commits, every event is handled once, in stream order."""
    app = el.App(f"{pg_url}?prefix=rv_{uuid.uuid4().hex[:8]}_", claim_timeout=2)
    proc = app.processor("typed", segments=2, batch_size=3)
    table = app.db.table("typed_rows")
    app.db.run_ddl(
        [f"CREATE TABLE {table} (id BIGSERIAL, stream TEXT, version BIGINT, position BIGINT)"]
    )

    @proc.on("A", "B")
    def record(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(
            f"INSERT INTO {table} (stream, version, position) VALUES (%s, %s, %s)",
            (event.stream_id, event.version, event.position),
        )

    for i in range(12):
        app.store.append(f"s-{i % 4}", [E("ABC"[i % 3])])
    app.start()
    try:
        app.wait_until_caught_up(20)
        conn = app.db.connect(autocommit=False)
        try:
            [late] = app.store.append("s-0", [E("B")], conn=conn)  # not committed yet
            for i in range(9):  # other streams: s-0's appenders wait for the one in flight
                app.store.append(f"t-{i % 4}", [E("ABC"[i % 3])])
            time.sleep(1.0)
            tokens = [s.token.position for s in app.status("typed").segments]
            assert max(tokens) < late, f"a token {tokens} passed position {late} in flight"
            conn.commit()
        finally:
            conn.close()
        app.wait_until_caught_up(20)
    finally:
        app.stop()
    rows = app.db.query(f"SELECT stream, version, position FROM {table} ORDER BY id")
    wanted = [e for e in app.store.iter_events() if e.type in ("A", "B")]
    app.close()
    assert sorted(r[2] for r in rows) == [e.position for e in wanted]
    last: dict[str, int] = {}
    for stream, version, _ in rows:
        assert version > last.get(stream, 0)
        last[stream] = version


# -- dispatch fast paths: on_batch only, replays ----------------------------------------------


def test_on_batch_only_processor_replays_without_its_no_replay_handler(store_url: str) -> None:
    """A processor with only on_batch handlers (no per-event loop): after a reset, replayed
    events reach the replay-safe handler (a batch flagged a replay when all of it is) and
    never the ``disallow_replay`` one; new events reach both."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("batches", segments=2, batch_size=50)
    calls: list[tuple[list[int], bool]] = []
    mailed: list[int] = []

    @proc.on_batch("Step")
    def project(events: list[el.Event], ctx: el.Context) -> None:
        calls.append(([e.position for e in events], ctx.is_replay))

    @proc.on_batch()
    @el.disallow_replay
    def mail(events: list[el.Event], ctx: el.Context) -> None:
        mailed.extend(e.position for e in events)

    for i in range(10):
        app.store.append(f"s-{i}", [E("Step")])
    run_until_caught_up(app, 20)
    assert sorted(mailed) == list(range(1, 11))
    app.reset("batches")
    for i in range(5):
        app.store.append(f"n-{i}", [E("Step")])
    calls.clear()
    run_until_caught_up(app, 20)
    app.close()
    assert sorted(p for positions, _ in calls for p in positions) == list(range(1, 16))
    for positions, replay in calls:
        assert replay == all(p <= 10 for p in positions)
    assert sorted(mailed) == list(range(1, 16))  # the new ones only, once


def test_two_nodes_with_parking_splits_and_merges_hand_each_event_out_once(
    store_url: str,
) -> None:
    """Everything the pooled loop's shortcuts must survive at once: two nodes sharing the
    segments (claims move while batches are read ahead), a split and a merge asked while
    they run, a key from the data, unhandled types, batches cut small, and a poison key
    parked in dead-letter mode. Each other event once, in order per key; the poison key's
    events from the failed one on are parked, none handled."""
    options: dict[str, Any] = {
        "segments": 2,
        "batch_size": 3,
        "policy": el.by_data("k"),
        "on_error": "dead_letter",
    }
    apps = [el.App(store_url, claim_timeout=2) for _ in range(2)]
    table = ""
    for app in apps:
        proc = app.processor("busy", **options)
        table = _key_recorder(app, proc, "busy_rows")

        @proc.on("A")
        def poison(event: el.Event, ctx: el.Context) -> None:
            if event.data["k"] == "k3" and event.position > 40:
                raise ValueError("poison")

    _append_keyed(apps[0].store, 120, keys=7, seed=0)
    apps[0].start()
    try:
        apps[1].start()
        _append_keyed(apps[0].store, 60, keys=7, seed=1)
        apps[0].split("busy", 0)
        _append_keyed(apps[0].store, 60, keys=7, seed=2)
        apps[0].merge("busy", 0)
        _append_keyed(apps[0].store, 60, keys=7, seed=3)
        for app in apps:
            app.wait_until_caught_up(60)
    finally:
        apps[1].stop()
        apps[0].stop()
    app = apps[0]
    parked = [d.position for d in app.dead_letter_list("busy")]
    events = [e for e in app.store.iter_events() if e.type in ("A", "B")]
    first = min(
        e.position for e in events if e.data["k"] == "k3" and e.type == "A" and e.position > 40
    )
    expected_parked = [e.position for e in events if e.data["k"] == "k3" and e.position >= first]
    rows = app.db.query(f"SELECT k, position FROM {table} ORDER BY id")
    for a in apps:
        a.close()
    assert parked == expected_parked
    handled = Counter(p for _, p in rows)
    assert not [p for p, c in handled.items() if c > 1], "handled twice"
    assert set(handled) == {e.position for e in events} - set(parked)
    last: dict[str, int] = {}
    for k, position in rows:
        assert position > last.get(k, 0), f"key {k}: {position} after {last[k]}"
        last[k] = position


@pytest.mark.parametrize("order", ["reset, merge", "merge, reset"])
def test_a_merge_does_not_turn_the_other_halfs_new_events_into_replays(
    store_url: str, order: str
) -> None:
    """A half that had handled nothing (its events never seen) and a half that had handled
    everything are merged and reset (in either order). With one replay end for the whole
    segment the other half's first-time events counted as replays and ``disallow_replay``
    handlers (the e-mails) skipped them, forever and silently; then both steps were refused.
    Now the token keeps a replay end per part: both steps work, every first-time event is
    mailed once, and the replayed ones are not mailed again."""
    app = el.App(store_url, claim_timeout=2)
    proc = app.processor("mails", segments=2, batch_size=50)
    sent: list[int] = []
    flags: dict[int, list[bool]] = {}

    @proc.on("Signup")
    @el.disallow_replay
    def mail(event: el.Event, ctx: el.Context) -> None:
        sent.append(event.position)

    @proc.on("Signup")
    def seen(event: el.Event, ctx: el.Context) -> None:
        flags.setdefault(event.position, []).append(ctx.is_replay)

    streams = [f"u-{i}" for i in range(12)]
    halves = {s: el.stable_hash(s) & 1 for s in streams}
    assert set(halves.values()) == {0, 1}
    for s in streams:
        app.store.append(s, [E("Signup")])
    app.start(node_index=0, nodes=2)  # only segment 0/1 runs: 1/1 sees nothing
    try:
        wait_for(lambda: app.status("mails").segments[0].caught_up, what="segment 0")
    finally:
        app.stop()
    first_half = sorted(sent)
    for step in order.split(", "):
        if step == "reset":
            app.reset("mails")  # 0/1 replays its events; 1/1 had none to replay
        else:
            assert app.merge("mails", 1) == "merged 1/1 and 0/1 into 0/0"
    run_until_caught_up(app, 20)
    app.close()
    never_seen = sorted(set(range(1, 13)) - set(first_half))
    assert sorted(sent) == sorted(first_half + never_seen), "first-time events not mailed once"
    assert flags == {
        **{p: [False, True] for p in first_half},
        **{p: [False] for p in never_seen},
    }


def test_a_bad_row_caught_by_the_handler_leaves_the_transaction_usable(
    store_url: str,
) -> None:
    """insert_rows refuses a row of the wrong width "and nothing is written". A handler that
    catches that and goes on must be able to: every row is checked before anything is sent
    (a failed COPY would leave the PostgreSQL transaction aborted)."""
    app = el.App(store_url)
    table = app.db.table("caught_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (a BIGINT, b BIGINT)"])
    p = app.db.param
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        with pytest.raises(el.InvalidInputError, match="row 1 has 1 values"):
            ctx.insert_rows(table, ["a", "b"], [(1, 2), (3,)])
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", (5, 6))
    rows = app.db.query(f"SELECT a, b FROM {table}")
    app.close()
    assert [tuple(r) for r in rows] == [(5, 6)]


def test_a_cursor_kept_in_a_closure_keeps_its_results(store_url: str) -> None:
    """A cursor kept only by a closure (a callback for later) is held: later statements get
    a cursor of their own."""
    app = el.App(store_url)
    table = app.db.table("closure_rows")
    app.db.run_ddl([f"CREATE TABLE {table} (n BIGINT)"])
    p = app.db.param
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        for n in range(3):
            ctx.execute(f"INSERT INTO {table} VALUES ({p})", (n,))

        kept = ctx.execute(f"SELECT n FROM {table} ORDER BY n")

        def later(cur: Any = kept) -> list[int]:
            return [r[0] for r in cur.fetchall()]

        del kept  # only the closure holds it now

        holders = [ctx.execute(f"SELECT count(*) FROM {table}")]
        ctx.execute(f"DELETE FROM {table} WHERE n = 0")
        ctx.execute(f"INSERT INTO {table} VALUES ({p})", (9,))
        assert holders[0].fetchone()[0] == 3
        assert later() == [0, 1, 2]
    app.close()
