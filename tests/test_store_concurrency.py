"""No skipped event, per-stream order: real writer processes against a tailing reader."""

from __future__ import annotations

import multiprocessing as mp
import random
import time

import eventlanes as el

E = el.NewEvent
WRITERS = 8
STREAMS = [f"order-{i}" for i in range(12)]  # few streams: writers overlap constantly


def _writer(url: str, writer: int, appends: int, out: mp.Queue) -> None:
    rng = random.Random(writer)
    store = el.open_store(url)
    db = store.db
    side = db.table("side_rows")
    written = 0
    for k in range(appends):
        stream = rng.choice(STREAMS)
        events = [E("Item", {"writer": writer, "k": k, "i": i}) for i in range(rng.randint(1, 3))]
        mode = k % 3
        if mode == 0:
            store.append(stream, events)
        elif mode == 1:
            # The appending transaction writes other rows first (and so holds an older xid).
            with db.transaction() as conn:
                conn.execute(f"INSERT INTO {side} (writer) VALUES ({db.param})", (writer,))
                time.sleep(rng.random() / 500)
                store.append(stream, events, conn=conn)
        else:
            while True:  # optimistic read-modify-write
                version = store.stream_version(stream)
                try:
                    store.append(stream, events, expected_version=version)
                    break
                except el.ConcurrencyError:
                    continue
        written += len(events)
    store.close()
    out.put(written)


def test_many_writer_processes_never_make_a_tailing_reader_skip(store_url: str) -> None:
    store = el.open_store(store_url)
    store.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {store.db.table('side_rows')} (writer INTEGER)"])
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(store_url, w, 150, out)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    seen: list[el.Event] = []
    after = 0
    while any(p.is_alive() for p in procs) or (batch := store.read(after=after, limit=50)):
        batch = store.read(after=after, limit=50)
        seen += batch
        if batch:
            after = batch[-1].position
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen += store.read(after=after, limit=100_000)
    written = sum(out.get(timeout=10) for _ in procs)

    positions = [e.position for e in seen]
    assert positions == sorted(set(positions)), "tailing reader went backwards or saw a duplicate"
    final = store.read(limit=100_000)
    assert len(final) == written
    assert positions == [e.position for e in final], "the tailing reader skipped committed events"
    by_stream: dict[str, list[int]] = {}
    for event in seen:
        by_stream.setdefault(event.stream_id, []).append(event.version)
    for stream, versions in by_stream.items():
        assert versions == list(range(1, len(versions) + 1)), f"{stream} out of version order"
    store.close()


def test_postgres_reader_waits_for_an_earlier_position_still_in_flight(pg_url: str) -> None:
    import psycopg

    url = f"{pg_url}?prefix=inflight_{random.randrange(10**9)}_"
    store = el.open_store(url)
    with psycopg.connect(store.db.url.target) as slow:  # a transaction, not autocommit
        [slow_pos] = store.append("slow", [E("A")], conn=slow)
        [fast_pos] = store.append("fast", [E("B")])  # commits while 'slow' is open
        assert fast_pos > slow_pos
        # Returning 'fast' now would let the reader's cursor pass 'slow' forever.
        assert store.read() == []
        assert store.head() == 0
        slow.commit()
    assert [e.stream_id for e in store.read()] == ["slow", "fast"]
    assert store.head() == fast_pos

    # An aborted append leaves a hole the reader passes once it is known to be empty.
    with psycopg.connect(store.db.url.target) as aborted:
        store.append("gone", [E("X")], conn=aborted)
        store.append("fast", [E("C")])
        assert [e.type for e in store.read(after=fast_pos)] == []
        aborted.rollback()
    assert [e.type for e in store.read(after=fast_pos)] == ["C"]
    store.close()


def test_postgres_stream_order_when_appender_wrote_other_rows_first(pg_url: str) -> None:
    """T1 starts first and writes elsewhere (older xid); T2 appends v1 and commits; T1 then
    appends v2. Readers must see v1 before v2 (ordering by xid would invert them)."""
    import psycopg

    store = el.open_store(f"{pg_url}?prefix=xidorder_{random.randrange(10**9)}_")
    side = store.db.table("side")
    store.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {side} (n int)"])
    with psycopg.connect(store.db.url.target) as t1:
        t1.execute(f"INSERT INTO {side} VALUES (1)")  # t1 now holds an xid
        store.append("s", [E("V1")], expected_version=0)  # t2, autocommit
        store.append("s", [E("V2")], expected_version=1, conn=t1)
        t1.commit()
    events = store.read()
    assert [(e.type, e.version) for e in events] == [("V1", 1), ("V2", 2)]
    assert events[0].position < events[1].position
    store.close()
