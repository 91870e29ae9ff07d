"""`eventlanes status --json`: the documented schema, health rules and exit codes, from the app
module and read-only from a store URL."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlanes.admin.health import SCHEMA
from eventlanes.cli import main
from tests.apps.ops_app import create_schema, fill, make_app
from tests.processing_helpers import wait_for

APP = "tests.apps.ops_app:app"


@pytest.fixture
def ops(store_url: str, tmp_path, monkeypatch):
    """A store where orders parked stream ``bad`` and billing's segment is failing on it."""
    flag = tmp_path / "flag"
    monkeypatch.setenv("EVENTLANES_TEST_OPS_URL", store_url)
    monkeypatch.setenv("EVENTLANES_TEST_OPS_FLAG", str(flag))
    # The CLI imports the app module: afresh, so that it reads this test's settings.
    monkeypatch.delitem(sys.modules, "tests.apps.ops_app", raising=False)
    app = make_app(store_url, str(flag))
    create_schema(app)
    fill(app.store)
    app.start(["orders", "billing"])
    try:
        app.wait_until_caught_up(30, ["orders"])
        wait_for(lambda: any(s.errors for s in app.status("billing").segments), 30)
    finally:
        app.stop()
    yield app, flag
    app.close()


def status(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["status", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_status_json_health_and_exit_codes(ops) -> None:
    app, flag = ops
    code, doc = status(APP, "billing")
    assert code == 1 and doc["schema"] == SCHEMA and doc["healthy"] is False
    [billing] = doc["processors"]
    [segment] = billing["segments"]
    assert segment["errors"] >= 1 and "billing refused bad v1" in segment["last_error"]
    assert billing["problems"] and not billing["healthy"]
    assert segment["position"] < billing["head"] == 62

    code, doc = status(APP, "orders")
    [orders] = doc["processors"]
    assert code == 1 and orders["dead_letters"] == 2 and orders["lag_events"] == 0
    assert orders["problems"] == ["2 dead letter(s) parked"]
    assert {s["segment"] for s in orders["segments"]} == {"0/1", "1/1"}
    assert all(s["caught_up"] and s["lag_seconds"] == 0 for s in orders["segments"])

    # The cause is fixed, the key retried: healthy again, exit code 0.
    flag.touch()
    result = CliRunner().invoke(main, ["dead-letters", APP, "orders", "--retry", "--key", "bad"])
    assert result.exit_code == 0 and "2 event(s) handled, 0 still parked" in result.output
    code, doc = status(APP, "orders")
    assert code == 0 and doc["healthy"] is True and doc["processors"][0]["problems"] == []


def test_max_lag_in_events_and_seconds(ops) -> None:
    """audit never ran: 62 events behind; healthy only within --max-lag."""
    assert status(APP, "audit")[0] == 0
    code, doc = status(APP, "audit", "--max-lag", "61")
    assert code == 1 and doc["processors"][0]["problems"] == ["lag 62 events > --max-lag 61"]
    assert status(APP, "audit", "--max-lag", "62")[0] == 0
    assert status(APP, "audit", "--max-lag", "1h")[0] == 0
    code, doc = status(APP, "audit", "--max-lag", "1ms")
    assert code == 1 and doc["max_lag"] == {"events": None, "seconds": 0.001}
    assert doc["processors"][0]["lag_seconds"] > 0.001
    result = CliRunner().invoke(main, ["status", APP, "--max-lag", "soon"])
    assert result.exit_code == 2 and "error:" in result.output and "soon" in result.output


def test_table_form_has_the_same_exit_code(ops) -> None:
    result = CliRunner().invoke(main, ["status", APP, "orders"])
    assert result.exit_code == 1
    assert "unhealthy:" in result.output and "2 dead letter(s) parked" in result.output


def _files(path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in path.parent.glob(path.name + "*")
        if not p.name.endswith("-shm")  # SQLite's shared-memory index: readers write it
    }


def test_status_from_url_without_the_app_module_reads_only(ops, store_url: str) -> None:
    app, _ = ops
    _, from_app = status(APP, "billing", "orders")
    db_file = Path(store_url.removeprefix("sqlite:///")) if store_url.startswith("sqlite") else None
    before = _files(db_file) if db_file else None
    code, doc = status("--url", store_url)
    # Processors = those with token rows (audit has never run or been asked about).
    assert [p["name"] for p in doc["processors"]] == ["billing", "orders"]
    assert code == 1
    by_name = {p["name"]: p for p in doc["processors"]}
    for p in from_app["processors"]:
        mine = by_name[p["name"]]
        assert mine["head"] == p["head"] and mine["dead_letters"] == p["dead_letters"]
        assert [(s["segment"], s["position"], s["errors"]) for s in mine["segments"]] == [
            (s["segment"], s["position"], s["errors"]) for s in p["segments"]
        ]
    code, doc = status("--url", store_url, "orders")
    assert code == 1 and [p["name"] for p in doc["processors"]] == ["orders"]
    if db_file:
        assert _files(db_file) == before  # not one byte of the database or its log written
    rows = app.db.query(f"SELECT DISTINCT processor FROM {app.db.table('tokens')}")
    assert "audit" not in {r[0] for r in rows}


def test_status_from_url_refuses_what_is_not_a_store(tmp_path) -> None:
    missing = tmp_path / "nothing.db"
    result = CliRunner().invoke(main, ["status", "--url", f"sqlite:///{missing}"])
    assert (
        result.exit_code == 2 and "error:" in result.output and "no SQLite store" in result.output
    )
    assert not os.path.exists(missing)


def test_a_processor_behind_in_another_source_is_not_caught_up(store_url: str, tmp_path) -> None:
    """Before: a processor reading another store (``sources=``) was measured against the
    app's own store alone: with 5 events waiting in the other store, status said caught up
    with lag 0 (app, JSON, health rules, metrics). Now they count, in events and in
    seconds, against that store's head."""
    import time

    import eventlanes as el
    from eventlanes.admin.health import MaxLag, processor_document, store_first_after

    legacy_url = f"sqlite:///{tmp_path}/legacy.db"
    legacy = el.open_store(legacy_url)
    app = el.App(store_url)
    seen: list[int] = []
    app.processor("merged", segments=2, sources={"legacy": legacy_url}).on_any(
        lambda event, ctx: seen.append(event.position)
    )
    app.store.append("a", [el.NewEvent("E")] * 3)
    legacy.append("b", [el.NewEvent("E")] * 2)
    app.start()
    try:
        app.wait_until_caught_up(30)
    finally:
        app.stop()
    assert app.status("merged").caught_up and len(seen) == 5
    legacy.append("b", [el.NewEvent("E")] * 5)
    time.sleep(1.1)  # the oldest waiting event is at least 1 s old
    view = app.status("merged")
    assert not view.caught_up and view.lag == 5
    doc = processor_document(view, store_first_after(app.store), MaxLag(seconds=1.0))
    assert doc["caught_up"] is False and doc["lag_events"] == 5
    assert doc["lag_seconds"] >= 1.0 and not doc["healthy"]
    assert any("--max-lag 1 s" in p for p in doc["problems"])
    app.start()
    try:
        app.wait_until_caught_up(30)
    finally:
        app.stop()
    view = app.status("merged")
    assert view.caught_up and view.lag == 0 and len(seen) == 10
    legacy.close()
    app.close()


def test_status_from_url_opens_read_only_and_refuses_a_newer_schema(store_url: str) -> None:
    """Before: ``status --url`` opened the database writable (SQLite's journal switch, a
    PostgreSQL session that could write: "never writes" held only as long as its queries did,
    and a SQLite store on a read-only mount could not be read), and read a store of a newer
    schema as if it knew its tables. Now its sessions refuse writes, and a newer schema is
    one error line."""
    import eventlanes as el
    from eventlanes.admin.inspect import ReadOnlyInspector

    app = el.App(store_url)
    app.processor("p").on_any(lambda event, ctx: None)
    app.store.append("s", [el.NewEvent("E")])
    app.initialize("p")
    inspector = ReadOnlyInspector(store_url)
    try:
        assert inspector.processors() == ["p"]
        with pytest.raises(Exception, match="read-only|readonly"):
            inspector.db.query(f"DELETE FROM {inspector.tokens}")
    finally:
        inspector.close()
    assert [s.position for s in app.tokens.status("p")] == [0]
    table = app.db.table("schema_migrations")
    with app.db.transaction() as conn:
        conn.execute(app.db.sql(f"INSERT INTO {table} (version, name, applied_at) "
                                "VALUES (?, ?, ?)"), (99, "future", 0))  # fmt: skip
    result = CliRunner().invoke(main, ["status", "--url", store_url])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: store ") and "has schema version 99, newer than" in lines[0]
    app.close()
