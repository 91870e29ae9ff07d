"""The web dashboard in a real headless browser (the system's chromium, driven by playwright):
a lagging processor and a parked dead letter are shown; retry handles the key."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.apps.ops_app import create_schema, fill, make_app
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("EVENTLANES_TEST_CHROMIUM", "/usr/bin/chromium")
# Set to a path to save a screenshot of the page (the README's is made this way).
SCREENSHOT = os.environ.get("EVENTLANES_DASHBOARD_SCREENSHOT")
BROWSER_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

sync_api = pytest.importorskip("playwright.sync_api")
if not shutil.which(CHROMIUM):
    pytest.skip(f"no chromium at {CHROMIUM} (.ci/run installs Debian's)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def dashboard(tmp_path):
    """orders (running here) parked stream ``bad``; audit never ran; the dashboard runs as
    `eventlanes dashboard` in its own process."""
    url = f"sqlite:///{tmp_path}/e.db"
    flag = tmp_path / "flag"
    app = make_app(url, str(flag))
    create_schema(app)
    fill(app.store, good=60)
    app.start(["orders", "billing"])
    app.wait_until_caught_up(30, ["orders"])
    port = _free_port()
    env = dict(os.environ, EVENTLANES_TEST_OPS_URL=url, EVENTLANES_TEST_OPS_FLAG=str(flag))
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "dashboard", "tests.apps.ops_app:app",
         "--port", str(port), "--refresh", "0.5"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: proc.poll() is not None or _up(base), 60, what="the dashboard")
        assert proc.poll() is None, proc.communicate()[0]
        yield app, flag, base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        app.stop()
        app.close()


def test_dashboard_shows_lag_and_dead_letters_and_retries_a_key(dashboard, tmp_path) -> None:
    app, flag, base = dashboard
    expect = sync_api.expect
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh profile
            executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS,
            viewport={"width": 1280, "height": 900},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: dialog.accept())  # the confirmations
            page.goto(base)
            audit = page.locator("#processor-audit")
            expect(audit.locator(".lag")).to_contain_text("lag 62 events")
            orders = page.locator("#processor-orders")
            expect(orders.locator(".badge")).to_have_text("unhealthy")
            row = orders.locator('tr.letter[data-key="bad"]')
            expect(row).to_contain_text("payment service refused bad v1")
            expect(row.locator("td").nth(1)).to_have_text("2")  # two events parked
            billing = page.locator("#processor-billing")
            expect(billing.locator("tr.failing")).to_contain_text("billing refused bad v1")
            if SCREENSHOT:
                page.screenshot(path=SCREENSHOT, full_page=True)

            flag.touch()  # the cause is fixed
            row.get_by_role("button", name="retry").click()
            expect(page.locator("#message")).to_have_text(
                "orders (key 'bad'): 2 event(s) handled, 0 still parked"
            )
            expect(orders.locator("tr.letter")).to_have_count(0)
            expect(orders.locator(".badge")).to_have_text("healthy")
        finally:
            browser.close()
    rows = app.db.query(f"SELECT position FROM {app.db.table('handled')} WHERE stream_id = 'bad'")
    assert sorted(rows) == [(61,), (62,)]
    assert app.dead_letter_list("orders") == []
