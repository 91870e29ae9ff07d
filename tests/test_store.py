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


@pytest.mark.parametrize("types", [None, ["T1"], ["T0", "T2"], ["T3", "T1", "Rare"]])
def test_reads_filtered_by_segments_and_types_match_a_plain_filter(
    store_url: str, types: list[str] | None
) -> None:
    """Reads with a segment filter and type filters (PostgreSQL plans some of them as one
    ordered walk per type, merged) return what filtering every event would, in order, with
    the same ``upto``, batch after batch."""
    store = el.open_store(store_url)
    for i in range(60):
        store.append(f"s-{i % 13}", [el.NewEvent(f"T{(i + j) % 4}", {"j": j}) for j in range(7)])
    store.append("rare", [el.NewEvent("Rare")])
    segments = [(1, 3), (2, 3), (3, 7)]  # the held segments of one node, of two masks
    everything = list(store.iter_events(batch_size=1000))

    def wanted(e: el.Event) -> bool:
        in_segment = any(e.routing_hash & mask == sid for sid, mask in segments)
        return in_segment and (types is None or e.type in types)

    expected = [e.position for e in everything if wanted(e)]
    got: list[int] = []
    after = 0
    while True:
        batch, upto = store.read_upto(after, 25, segments, types)
        got += [e.position for e in batch]
        if upto == after:
            break
        if len(batch) == 25:
            assert upto == batch[-1].position
        after = upto
    store.close()
    assert got == expected and expected
