"""What only the SQL token stores do: share the caller's transaction, open databases of earlier
versions, and read status without writing. Everything every backend does is in the token-store
contract (tests/test_token_store_contract.py)."""

from __future__ import annotations

import sqlite3
import threading
import uuid

import pytest

import eventlanes as el
from eventlanes import Segment, Token
from eventlanes.db import open_database

P = "user-state"

# The schema as the previous version created it: no ``refused`` column, no paused table.
OLD_TOKENS = """CREATE TABLE {t}tokens (
    processor TEXT NOT NULL, segment_id BIGINT NOT NULL, mask BIGINT NOT NULL,
    position BIGINT NOT NULL, token_detail TEXT, owner TEXT, claimed_since BIGINT,
    claim_deadline BIGINT, released_by TEXT, release_until BIGINT, request TEXT,
    last_error TEXT, errors INTEGER NOT NULL DEFAULT 0, retry_at BIGINT,
    updated_at BIGINT NOT NULL, PRIMARY KEY (processor, segment_id))"""
OLD_NODES = """CREATE TABLE {t}nodes (processor TEXT NOT NULL, node TEXT NOT NULL,
    last_seen BIGINT NOT NULL, PRIMARY KEY (processor, node))"""


def test_token_store_commits_with_the_callers_transaction(store_url: str) -> None:
    ts = el.open_token_store(store_url)
    db = ts.db
    proj = db.table("projection")
    db.run_ddl([f"CREATE TABLE IF NOT EXISTS {proj} (k TEXT)"])
    ts.initialize(P)
    ts.claim(P, 0, "node-a")
    ins = db.sql(f"INSERT INTO {proj} (k) VALUES (?)")
    with db.transaction() as conn:
        conn.execute(ins, ("one",))
        ts.store(P, 0, Token(1), "node-a", conn=conn)
    # A lost claim fails the token write, and the projection write rolls back with it.
    ts.release(P, 0, "node-a")
    ts.claim(P, 0, "node-b")
    with pytest.raises(el.ClaimLostError), db.transaction() as conn:
        conn.execute(ins, ("two",))
        ts.store(P, 0, Token(2), "node-a", conn=conn)
    assert db.query(f"SELECT k FROM {proj}") == [("one",)]
    assert ts.token(P, 0) == Token(1)
    db.close()


def test_a_database_of_the_previous_version_opens_and_gains_the_new_parts(store_url) -> None:
    db = open_database(store_url)
    prefix = db.prefix
    db.run_ddl([OLD_TOKENS.format(t=prefix), OLD_NODES.format(t=prefix)])
    with db.transaction() as conn:
        conn.execute(
            db.sql(
                f"INSERT INTO {prefix}tokens (processor, segment_id, mask, position, "
                "token_detail, request, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            ),
            (P, 1, 1, 70, '{"ahead":[[2,3,90]]}', "merge", 0),
        )
        conn.execute(
            db.sql(
                f"INSERT INTO {prefix}tokens (processor, segment_id, mask, position, updated_at) "
                "VALUES (?, ?, ?, ?, ?)"
            ),
            (P, 0, 1, 5, 0),
        )
    db.close()
    for _ in range(2):  # the second opening finds everything in place
        ts = el.open_token_store(store_url)
        assert ts.segments(P) == Segment.initial(2)
        assert ts.token(P, 1) == Token(70, ((2, 3, 90),))
        assert ts.is_paused(P) is False and ts.status(P)[1].request_refused is None
        ts.db.close()
    ts = el.open_token_store(store_url)
    assert ts.status(P)[1].request == "merge"
    assert ts.refuse(P, 1, "sibling is busy") is True
    assert ts.status(P)[1].request_refused == "sibling is busy"
    ts.pause(P)
    assert ts.claim(P, 0, "node-a") is None and ts.status(P)[0].paused
    ts.resume(P)
    assert ts.claim(P, 0, "node-a") is not None
    ts.db.close()


def test_many_openers_of_an_old_database_at_once_all_succeed(store_url) -> None:
    db = open_database(store_url)
    db.run_ddl([OLD_TOKENS.format(t=db.prefix), OLD_NODES.format(t=db.prefix)])
    db.close()
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            barrier.wait()
            ts = el.open_token_store(store_url)
            ts.pause(f"p{threading.get_ident()}")
            ts.db.close()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    ts = el.open_token_store(store_url)
    ts.initialize(P)
    assert ts.refuse(P, 0, "nothing pending") is False  # the refused column is there
    ts.db.close()


def test_status_on_sqlite_never_writes(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/tokens.db"
    ts = el.open_token_store(url)
    ts.initialize(P, segments=3)
    ts.pause("paused-one")
    ts.db.close()
    watcher = sqlite3.connect(f"{tmp_path}/tokens.db")

    def version() -> int:
        return watcher.execute("PRAGMA data_version").fetchone()[0]

    before = version()
    ts = el.open_token_store(url)  # the schema is current: opening only reads
    assert len(ts.status(P)) == 3 and ts.status("never-run") == []
    assert ts.is_paused("paused-one") and ts.processors() == [P]
    assert ts.live_nodes(P) == [] and ts.token(P, 0) == Token(0)
    assert version() == before  # no other connection committed anything
    ts.claim(P, 0, "node-a")  # a real write is seen by the same check
    assert version() != before
    ts.db.close()
    watcher.close()


def test_status_on_a_read_only_postgres_session(pg_url: str, monkeypatch) -> None:
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}prefix=ro_{uuid.uuid4().hex[:12]}_"
    ts = el.open_token_store(url)
    ts.initialize(P, segments=3)
    ts.pause("paused-one")
    ts.db.close()
    # Every session of this store is read-only: any write would fail loudly.
    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_read_only=on")
    ro = el.open_token_store(url)
    try:
        assert len(ro.status(P)) == 3 and ro.status("never-run") == []
        assert ro.is_paused("paused-one") and ro.processors() == [P]
        assert ro.live_nodes(P) == [] and ro.token(P, 0) == Token(0)
        with pytest.raises(Exception, match="read-only"):
            ro.claim(P, 0, "node-a")  # the session really is read-only
    finally:
        ro.db.close()
