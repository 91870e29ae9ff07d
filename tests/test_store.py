"""Event store behaviour outside the shipped contract (tests/test_store_contract.py): reopening
by URL and URL errors."""

from __future__ import annotations

import pytest

import eventlanes as el

E = el.NewEvent


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
