"""Operations that tell the truth (issue 30: items 8, 15, 16, 17, 18 and dropped duplicates):
a corrupt token row shown as such while the rest is still listed, duplicates dropped by
aggregations visible, ``migrate``/``info`` taking ``module:app``, one ``error:`` line for a
dashboard port in use, the dashboard's reset asking as the CLI does, retired versions named
as retired."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.admin.health import MaxLag
from eventlanes.cli import main
from tests.processing_helpers import run_until_caught_up

ROOT = Path(__file__).resolve().parent.parent

APP_SOURCE = """
import eventlanes as el

app = el.App({url!r})
audit = app.processor("audit", segments=2)


@audit.on("Placed")
def seen(event, ctx):
    pass


other = app.processor("other")


@other.on("Placed")
def also(event, ctx):
    pass


app.aggregation("totals", key="customer", on="Placed", fields={{"n": el.count()}})
"""


def _app_file(tmp_path: Path, url: str) -> str:
    """An app module in a file of its own (a name of its own: the loader keeps modules)."""
    path = tmp_path / f"round4_{uuid.uuid4().hex[:10]}.py"
    path.write_text(APP_SOURCE.format(url=url))
    return f"{path}:app"


def _status(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["status", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def ran(store_url: str, tmp_path: Path):
    """The app above, run over a few events (token rows and states exist)."""
    spec = _app_file(tmp_path, store_url)
    from eventlanes.loader import load_app

    app = load_app(spec)
    for i in range(6):
        app.store.append(f"order-{i}", [el.NewEvent("Placed", {"customer": f"c{i % 2}"})])
    run_until_caught_up(app)
    yield app, spec
    app.close()


def _corrupt(app: el.App, processor: str, segment_id: int, detail: str) -> None:
    tokens = app.db.table("tokens")
    with app.db.transaction() as conn:
        conn.execute(
            app.db.sql(
                f"UPDATE {tokens} SET token_detail = ? WHERE processor = ? AND segment_id = ?"
            ),
            (detail, processor, segment_id),
        )


# -- item 8: a corrupt token row ---------------------------------------------------------------
def test_a_corrupt_token_row_is_shown_as_such_and_the_rest_still_listed(ran, store_url) -> None:
    app, spec = ran
    segment = app.status("audit").segments[1].segment
    _corrupt(app, "audit", segment.id, "{not json")
    from_app = _status(spec)
    from_url = _status("--url", store_url)
    for code, doc in (from_app, from_url):
        assert code == 1 and not doc["healthy"]
        by_name = {p["name"]: p for p in doc["processors"]}
        assert {"audit", "other", "totals"} <= set(by_name)
        assert by_name["other"]["healthy"] and by_name["totals"]["healthy"]
        audit = by_name["audit"]
        assert len(audit["segments"]) == 2  # the sound segment is still listed
        bad = [s for s in audit["segments"] if s["corrupt"]]
        assert [s["segment"] for s in bad] == [str(segment)]
        assert [s["corrupt"] for s in audit["segments"] if s is not bad[0]] == [None]
        assert any(f"segment {segment}: corrupt token row" in p for p in audit["problems"])
    table = CliRunner().invoke(main, ["status", spec])
    assert table.exit_code == 1 and "corrupt token row" in table.output
    assert "Traceback" not in table.output

    from eventlanes.dashboard.page import snapshot

    page = snapshot(app, MaxLag())
    audit = next(p for p in page["processors"] if p["name"] == "audit")
    assert [s["segment"] for s in audit["segments"] if s["corrupt"]] == [str(segment)]


def test_a_token_row_of_another_shape_is_corrupt_too(ran, store_url) -> None:
    app, spec = ran
    _corrupt(app, "other", 0, '{"ahead": [[1, 2]]}')  # JSON, but not a token's
    for code, doc in (_status(spec, "other"), _status("--url", store_url, "other")):
        [other] = doc["processors"]
        assert code == 1 and other["segments"][0]["corrupt"]


# -- dropped duplicates ----------------------------------------------------------------------
def test_duplicates_dropped_by_an_aggregation_are_visible(ran, store_url) -> None:
    app, spec = ran
    states = app.db.table("aggregates")
    update = app.db.sql(f"UPDATE {states} SET dropped = ?, dropped_by = ? WHERE key = ?")
    with app.db.transaction() as conn:  # as the fold counts them: per key, and by root source
        conn.execute(update, (3, '{"up":2}', "c0"))  # one drop counted before sources were
        conn.execute(update, (4, '{"orders":2,"up":1}', "c1"))  # and one more
    assert app.get("totals").dropped() == 7
    for _, doc in (_status(spec), _status("--url", store_url)):
        by_name = {p["name"]: p for p in doc["processors"]}
        assert by_name["totals"]["dropped_duplicates"] == 7
        assert by_name["totals"]["dropped_duplicates_by_source"] == {"orders": 2, "up": 3}
        assert by_name["audit"]["dropped_duplicates"] is None  # not an aggregation
        assert by_name["audit"]["dropped_duplicates_by_source"] is None
    table = CliRunner().invoke(main, ["status", spec, "totals"])
    assert "7 duplicate(s) dropped" in table.output
    assert "3 of up, 2 of orders, 2 counted before drops had a source" in table.output

    from prometheus_client import generate_latest

    from eventlanes.admin.metrics import registry_for

    text = generate_latest(registry_for(app, None)).decode()
    assert 'eventlanes_duplicates_dropped{processor="totals"} 7.0' in text
    assert 'eventlanes_duplicates_dropped{processor="audit"}' not in text
    assert 'eventlanes_duplicates_dropped_by_source{processor="totals",source="up"} 3.0' in text
    assert 'eventlanes_duplicates_dropped_by_source{processor="totals",source="orders"} 2.0' in text

    from eventlanes.dashboard.page import snapshot

    page = snapshot(app, MaxLag())
    totals = next(p for p in page["processors"] if p["name"] == "totals")
    assert totals["dropped_duplicates"] == 7
    assert totals["dropped_duplicates_by_source"] == {"orders": 2, "up": 3}


# -- item 15: migrate and info take module:app -------------------------------------------------
def test_migrate_and_info_take_an_app_as_every_other_command(ran) -> None:
    app, spec = ran
    info = CliRunner().invoke(main, ["info", spec])
    assert info.exit_code == 0, info.output
    assert "6" in info.output and "invalid store URL" not in info.output
    check = CliRunner().invoke(main, ["migrate", spec, "--check"])
    assert check.exit_code == 0 and "up to date" in check.output, check.output
    done = CliRunner().invoke(main, ["migrate", spec])
    assert done.exit_code == 0 and "invalid store URL" not in done.output, done.output
    wrong = CliRunner().invoke(main, ["info", "no_such_module_round4:app"])
    assert wrong.exit_code != 0 and wrong.output.count("error:") == 1
    assert "no_such_module_round4" in wrong.output


# -- item 16: the dashboard on a port in use -----------------------------------------------------
def test_the_dashboard_on_a_port_in_use_says_so_in_one_line(tmp_path) -> None:
    pytest.importorskip("uvicorn")
    spec = _app_file(tmp_path, f"sqlite:///{tmp_path / 'd.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("EVENTLANES_DASHBOARD_TOKEN", None)
        done = subprocess.run(
            [sys.executable, "-m", "eventlanes.cli", "dashboard", spec, "--port", str(port)],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 2  # an error a user can fix, as every other one
    assert "dashboard of" not in out  # no success line
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error:"), out
    assert f"127.0.0.1:{port}" in errors[0] and "in use" in errors[0]
    assert "Errno" not in out


# -- item 17: the dashboard's reset asks as the CLI does --------------------------------------
def test_the_dashboards_reset_asks_when_the_plan_warns(ran) -> None:
    pytest.importorskip("starlette")
    from eventlanes.dashboard import actions

    app, _ = ran
    plan = app.reset_plan("audit", "tail")
    assert plan.warnings  # no on_reset handler: rows may be written twice
    before = [s.position for s in app.status("audit").segments]
    with pytest.raises(el.InvalidInputError, match="confirm") as refused:
        actions.act(app, "audit", "reset", {"to": "tail"})
    assert plan.warnings[0] in str(refused.value)
    assert [s.position for s in app.status("audit").segments] == before  # nothing reset
    with pytest.raises(el.InvalidInputError, match="confirm"):
        actions.act(app, "audit", "reset", {"to": "tail", "confirm": "yes"})
    done = actions.act(app, "audit", "reset", {"to": "tail", "confirm": True})
    assert done.startswith("audit: reset")
    assert actions.plan(app, "audit", "reset-plan", {"to": "tail"})["confirm"] is True


# -- item 18: retired versions named as retired -------------------------------------------------
VERSIONS_SOURCE = """
import eventlanes as el

app = el.App({url!r})
app.aggregation("totals", key="customer", on="Placed", fields={{"n": el.count()}}, segments=2)
app.aggregation("totals", version=2, key="customer", on="Placed", fields={{"n": el.count()}})
"""


def test_a_retired_version_still_defined_is_named_retired(store_url, tmp_path, caplog) -> None:
    path = tmp_path / f"round4v_{uuid.uuid4().hex[:10]}.py"
    path.write_text(VERSIONS_SOURCE.format(url=store_url))
    spec = f"{path}:app"
    from eventlanes.loader import load_app

    app = load_app(spec)
    try:
        app.store.append("o1", [el.NewEvent("Placed", {"customer": "c"})])
        run_until_caught_up(app)
        app.promote("totals@v2")
        app.retire("totals")
        view = app.status("totals")
        assert view.version is not None and view.version.retired
        assert view.segments == [] and view.layout_note is None
        code, doc = _status(spec)
        totals = next(p for p in doc["processors"] if p["name"] == "totals")
        assert totals["retired"] is True and totals["healthy"], totals
        assert not any("failed attempt" in p for p in totals["problems"])
        assert any("retired" in n for n in totals["notes"])
        table = CliRunner().invoke(main, ["status", spec, "totals"])
        assert "0/0" not in table.output and "retired" in table.output
        assert "failed attempt" not in table.output

        other = el.App(store_url)  # a node whose app still defines it
        other.aggregation("totals", key="customer", on="Placed", fields={"n": el.count()},
                          segments=2)  # fmt: skip
        try:
            with caplog.at_level("WARNING"), pytest.raises(el.VersionError, match="retired"):
                other.initialize("totals")
            assert "stored layout" not in caplog.text
        finally:
            other.close()
    finally:
        app.close()


def test_the_dashboards_reset_dialog_asks_before_a_reset_that_warns(tmp_path) -> None:
    """In a real chromium: the plan's warning shown, Reset disabled until ticked."""
    pytest.importorskip("starlette")
    pytest.importorskip("playwright.sync_api")
    from tests.apps.dashboard_app import make_app
    from tests.apps.ops_app import create_schema, fill
    from tests.test_dashboard import TOKEN, _open, browser, dashboard, expect

    url, flag = f"sqlite:///{tmp_path}/e.db", tmp_path / "flag"
    app = make_app(url, str(flag))
    create_schema(app)
    fill(app.store, good=10)
    run_until_caught_up(app, processors=["audit"])
    handled = {s.position for s in app.status("audit").segments}
    env = dict(os.environ, EVENTLANES_TEST_OPS_URL=url, EVENTLANES_TEST_OPS_FLAG=str(flag))
    try:
        with dashboard(env) as served, browser(tmp_path) as page:
            page.goto(served.base)
            audit = page.locator("#processor-audit")
            _open(page, audit.get_by_role("button", name="reset…"), TOKEN)
            page.fill("#action-to", "tail")
            page.click("#action-confirm")  # "Show what it does"
            expect(page.locator("#action-plan")).to_contain_text("written a second time")
            expect(page.locator("#action-confirm")).to_be_disabled()
            assert {s.position for s in app.status("audit").segments} == handled
            page.check("#action-confirm-warnings")
            expect(page.locator("#action-confirm")).to_be_enabled()
            page.click("#action-confirm")
            expect(page.locator("#message")).to_contain_text("audit: reset")
        assert {s.position for s in app.status("audit").segments} == {0}
    finally:
        app.close()
