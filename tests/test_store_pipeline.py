"""Pipelined transactions (``db.transaction(pipeline=True)``): the same results as plain ones,
and a fenced token update still refuses to commit without its claim."""

from __future__ import annotations

import pytest

import eventlanes as el

E = el.NewEvent


def _side_table(db) -> str:
    side = db.table("side_rows")
    db.run_ddl([f"CREATE TABLE IF NOT EXISTS {side} (n INTEGER NOT NULL)"])
    return side


def test_pipelined_transaction_commits_or_rolls_back_as_a_whole(store: el.EventStore) -> None:
    db = store.db
    side = _side_table(db)
    insert = f"INSERT INTO {side} (n) VALUES ({db.param})"
    with db.transaction(pipeline=True) as conn:
        for n in range(50):
            conn.execute(insert, (n,))
        store.append("s", [E("A")], expected_version=0, conn=conn)
        # A statement whose result is read waits for everything before it.
        assert conn.execute(f"SELECT count(*) FROM {side}").fetchone()[0] == 50
    with pytest.raises(RuntimeError), db.transaction(pipeline=True) as conn:
        conn.execute(insert, (99,))
        store.append("s", [E("B")], expected_version=1, conn=conn)
        raise RuntimeError("handler failed")
    assert db.query(f"SELECT count(*), max(n) FROM {side}") == [(50, 49)]
    assert [e.type for e in store.read()] == ["A"]


def test_a_failing_queued_statement_rolls_back_everything(store: el.EventStore) -> None:
    db = store.db
    side = _side_table(db)
    with pytest.raises(Exception) as info, db.transaction(pipeline=True) as conn:
        conn.execute(f"INSERT INTO {side} (n) VALUES ({db.param})", (1,))
        conn.execute(f"INSERT INTO {side} (n) VALUES ({db.param})", (None,))  # NOT NULL
    assert "null" in str(info.value).lower()
    assert db.query(f"SELECT count(*) FROM {side}") == [(0,)]


def test_token_update_in_a_pipeline_detects_a_lost_claim(store: el.EventStore) -> None:
    db = store.db
    side = _side_table(db)
    tokens = el.open_token_store(db, claim_timeout=30)
    tokens.initialize("proj", segments=1)
    assert tokens.claim("proj", 0, "me") is not None
    with db.transaction(pipeline=True) as conn:
        conn.execute(f"INSERT INTO {side} (n) VALUES ({db.param})", (1,))
        tokens.store("proj", 0, 10, "me", conn=conn)
    assert tokens.token("proj", 0).position == 10
    # Another node takes the segment over (as after an expired claim).
    db.query(f"UPDATE {tokens.table} SET owner = 'thief' RETURNING owner")
    with pytest.raises(el.ClaimLostError, match="thief"), db.transaction(pipeline=True) as conn:
        for n in range(2, 20):
            conn.execute(f"INSERT INTO {side} (n) VALUES ({db.param})", (n,))
        tokens.store("proj", 0, 20, "me", conn=conn)
    assert tokens.token("proj", 0).position == 10
    assert db.query(f"SELECT n FROM {side}") == [(1,)]
