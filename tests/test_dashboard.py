"""The web dashboard in a real headless browser (the system's chromium, driven by playwright),
served by `eventlanes dashboard` in its own process, on an app running in this one.

What an operator relies on: health by the same rule as `status --max-lag`; rates, lag history
and ETA from the dashboard's own polls; the retry countdown; guarantee and mode; actions in
dialogs (never window.prompt/confirm) that need the operator token; relative URLs that work
behind a reverse proxy under a path prefix; a page that fits a phone.

EVENTLANES_DASHBOARD_SCREENSHOTS=DIR writes dashboard.png (1400 px) and dashboard-phone.png
(390 px) there: the docs' (how-to/dashboard.md) are made with DIR=docs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from tests.apps.dashboard_app import make_app
from tests.apps.ops_app import create_schema, fill
from tests.kafka_helpers import create_topic, high_watermarks, produce
from tests.processing_helpers import run_until_caught_up, wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.dashboard_app:app"
CHROMIUM = os.environ.get("EVENTLANES_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("EVENTLANES_DASHBOARD_SCREENSHOTS")
BROWSER_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
TOKEN = f"operator-{uuid.uuid4().hex}"

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect
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


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json", **(headers or {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Served:
    """A process serving HTTP (the dashboard, the proxy) and what it printed."""

    def __init__(self, proc: subprocess.Popen, base: str) -> None:
        self.proc, self.base, self.output = proc, base, ""

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.output = self.proc.communicate(timeout=30)[0]
        return self.output


@contextlib.contextmanager
def dashboard(env: dict[str, str], *args: str, token: str | None = TOKEN) -> Iterator[Served]:
    """`eventlanes dashboard APP --max-lag 10 --refresh 0.5` in its own process."""
    port = _free_port()
    env = dict(env)
    env.pop("EVENTLANES_DASHBOARD_TOKEN", None)
    if token is not None:
        env["EVENTLANES_DASHBOARD_TOKEN"] = token
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "dashboard", APP, "--port", str(port),
         "--refresh", "0.5", "--max-lag", "10", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    served = Served(proc, f"http://127.0.0.1:{port}/")
    try:
        wait_for(lambda: proc.poll() is not None or _up(served.base), 60, what="the dashboard")
        assert proc.poll() is None, proc.communicate()[0]
        yield served
    finally:
        served.stop()


@contextlib.contextmanager
def browser(tmp_path: Path, width: int = 1400) -> Iterator[Any]:
    """A page in a fresh chromium profile; a native dialog (prompt, confirm) fails the test."""
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / f"profile-{uuid.uuid4().hex[:6]}"), executable_path=CHROMIUM,
            headless=True, args=BROWSER_ARGS, viewport={"width": width, "height": 900},
        )  # fmt: skip
        native: list[str] = []
        try:
            page = context.new_page()
            page.on("dialog", lambda d: (native.append(f"{d.type}: {d.message}"), d.dismiss()))
            yield page
        finally:
            context.close()
        assert native == [], f"the page used native dialogs: {native}"


@pytest.fixture
def world(tmp_path: Path, kafka_broker) -> Iterator[tuple[el.App, Path, dict[str, str]]]:
    """The app running here: orders (stream ``bad`` parked), billing (failing on it), the
    ingestor (one record parked); audit and orders@v2 never run."""
    bootstrap = kafka_broker.bootstrap
    topic = create_topic(bootstrap, 2)
    records = [(f"r-{i % 4}", {"i": i}, None) for i in range(16)]
    produce(bootstrap, topic, [*records, ("r-bad", b"not json", None)])
    hw = high_watermarks(bootstrap, topic, 2)
    url = f"sqlite:///{tmp_path}/e.db"
    flag = tmp_path / "flag"
    app = make_app(url, str(flag), bootstrap, topic)
    create_schema(app)
    fill(app.store, good=60)
    app.start(["orders", "billing", "readings-in"])
    try:
        wait_for(
            lambda: all(p.high_watermark is not None and p.position == hw[p.partition]
                        for p in app.ingest_status("readings-in").partitions)
            and len(app.ingest_status("readings-in").partitions) == 2,
            60, what="the records ingested",
        )  # fmt: skip
        app.wait_until_caught_up(30, ["orders"])
        env = dict(
            os.environ,
            EVENTLANES_TEST_OPS_URL=url,
            EVENTLANES_TEST_OPS_FLAG=str(flag),
            EVENTLANES_TEST_DASH_BOOTSTRAP=bootstrap,
            EVENTLANES_TEST_DASH_TOPIC=topic,
        )
        yield app, flag, env
    finally:
        app.stop()
        app.close()


def _open(page: Any, button: Any, token: str | None = None) -> Any:
    """Click an action's button; its dialog opens (with the token field when none is kept)."""
    button.click()
    dialog = page.locator("#action-dialog")
    expect(dialog).to_be_visible()
    if token is not None:
        page.fill("#action-token", token)
    return dialog


def _status_cli(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "status", APP, "--json", "--max-lag", "10"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    return json.loads(done.stdout)


def _health(doc: dict[str, Any]) -> dict[str, bool]:
    return {p["name"]: p["healthy"] for p in [*doc["processors"], *doc.get("ingestors", [])]}


def test_dashboard_health_history_and_actions_in_dialogs(world, tmp_path: Path) -> None:
    app, flag, env = world
    with dashboard(env) as served, browser(tmp_path) as page:
        base = served.base
        # Health by status's rule: the same verdicts, the same reasons, for everything shown.
        api, cli = _get(base + "api/status"), _status_cli(env)
        assert set(api) == set(cli) and api["max_lag"] == {"events": 10, "seconds": None}
        assert _health(api) == _health(cli) == {
            "orders": False, "billing": False, "audit": False, "orders@v2": False,
            "readings-in": False,
        }  # fmt: skip
        by_name = {p["name"]: p for p in cli["processors"]}
        lag = by_name["audit"]["lag_events"]
        assert by_name["audit"]["problems"] == [f"lag {lag} events > --max-lag 10"]
        assert [p for p in api["processors"] if p["name"] == "audit"][0]["problems"] == [
            f"lag {lag} events > --max-lag 10"
        ]
        assert not {"guarantee", "letter_groups", "actions"} & set(api["processors"][0])

        page.goto(base)
        expect(page.locator("#app-name")).to_have_text(APP)
        expect(page.locator("#store-url")).to_have_text(env["EVENTLANES_TEST_OPS_URL"])
        expect(page.locator("#max-lag")).to_have_text("lag ≤ 10 events")
        expect(page.locator("#access")).to_contain_text("Actions need the operator token")
        audit = page.locator("#processor-audit")
        expect(audit.locator(".badge.health")).to_have_text("unhealthy")
        expect(audit.locator(".problem")).to_have_text(f"lag {lag} events > --max-lag 10")
        expect(audit.locator(".eta")).to_contain_text("not catching up")
        expect(audit.locator(".toolbar button")).to_have_text(["pause", "reset…"])  # 1 segment
        orders = page.locator("#processor-orders")
        expect(orders.locator(".chip.guarantee")).to_have_text("exactly-once")
        expect(orders.locator(".chip.mode")).to_have_text("pooled")
        expect(orders.locator(".toolbar button")).to_have_text(
            ["split…", "merge…", "release…", "pause", "reset…"]
        )
        expect(orders.locator("table.segments tbody tr")).to_have_count(2)
        expect(orders.locator("table.segments button")).to_have_count(0)  # not on every row
        row = orders.locator('tr.letter[data-key="bad"]')
        expect(row).to_contain_text("payment service refused bad v1")
        expect(row.locator("td").nth(1)).to_have_text("2")  # two events parked
        v2 = page.locator('[id="processor-orders@v2"]')
        expect(v2.locator(".badge.version")).to_contain_text("version 2 of orders: not serving")
        expect(v2.locator(".toolbar button").first).to_have_text("promote")

        # The retry countdown is the one api/status returns, counting down.
        billing = page.locator("#processor-billing")
        expect(billing.locator("tr.failing")).to_contain_text("billing refused bad v1")
        countdown = billing.locator(".countdown")
        expect(countdown).to_have_text(re.compile(r"retry (in \d+ s|due)"))
        # The segment keeps failing and backing off, so a poll of the page and a read of the API
        # may straddle a new attempt: they must agree within a few samples, not on the first.
        samples = []
        for _ in range(20):
            api_retry = _get(base + "api/status")["processors"][1]["segments"][0][
                "retry_in_seconds"
            ]
            shown = countdown.text_content() or ""
            seconds = int(re.findall(r"\d+", shown)[0]) if "in" in shown else 0
            samples.append((shown, api_retry))
            if api_retry is not None and api_retry > 2 and abs(seconds - api_retry) <= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the page's countdown never agreed with api/status: {samples}")

        # Kafka: partitions (position, high watermark, lag) and the parked record.
        ingestor = page.locator("#ingestor-readings-in")
        expect(ingestor.locator("table.partitions tbody tr")).to_have_count(2)
        for q in _get(base + "api/status")["ingestors"][0]["partitions"]:
            cells = ingestor.locator(f'tr[data-partition="{q["partition"]}"] td')
            expect(cells.nth(1)).to_have_text(f"{q['position']:,}")
            expect(cells.nth(2)).to_contain_text(f"{q['high_watermark']:,}")
            expect(cells.nth(3)).to_have_text("0")
        expect(ingestor.locator('tr.letter[data-key="r-bad"]')).to_contain_text("not be decoded")

        # Rates from the dashboard's own polls: 40 new events, each counted once.
        before = time.time()
        for i in range(40):
            app.store.append(f"n-{i % 5}", [el.NewEvent("Ordered", {"n": i})])
        app.wait_until_caught_up(30, ["orders"])
        head = app.store.head()
        wait_for(
            lambda: all(
                s["position"] == head
                for s in _get(base + "api/status")["processors"][0]["segments"]
            ),
            30,
            what="orders' tokens stored",
        )
        time.sleep(1.2)  # two more polls
        samples = _get(base + "api/history")["series"]["orders"]["samples"]
        counted = [(s["at"], s["rate"]) for s in samples if s["at"] > before]
        previous = max(s["at"] for s in samples if s["at"] <= before)
        handled = 0.0
        for at, rate in counted:
            assert rate is not None
            handled += rate * (at - previous)
            previous = at
        assert handled == pytest.approx(40.0), counted
        expect(orders.locator(".chart.rate path.line")).to_have_attribute("d", re.compile(r"L"))
        expect(orders.locator(".eta")).to_contain_text("caught up")

        page.wait_for_timeout(1500)  # a little history in the charts
        if SCREENSHOTS:  # the docs' pictures: half a minute of a load that rises and falls
            for step in range(60):
                burst = round(2 + 14 * math.sin(step / 59 * math.pi))
                for i in range(burst):
                    app.store.append(f"n-{(step + i) % 9}", [el.NewEvent("Ordered", {"n": i})])
                page.wait_for_timeout(500)
        shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
        page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        # A phone: the page does not scroll sideways (wide tables scroll in their boxes).
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=str(shots / "dashboard-phone.png"), full_page=True)
        page.set_viewport_size({"width": 1400, "height": 900})

        # A refused action shows why in its dialog: version 2 has not run.
        dialog = _open(page, v2.get_by_role("button", name="promote"), TOKEN)
        page.click("#action-confirm")
        expect(page.locator("#action-error")).to_contain_text(
            "cannot promote 'orders@v2': 'orders@v2' has not run yet"
        )
        page.click("#action-cancel")
        expect(dialog).to_be_hidden()

        # Retry through a dialog (the token is kept for this tab from now on).
        flag.touch()  # the cause is fixed
        _open(page, row.get_by_role("button", name="retry"))
        expect(page.locator("#token-field")).to_be_hidden()
        expect(page.locator("#action-title")).to_have_text("Retry bad of orders")
        page.click("#action-confirm")
        expect(page.locator("#message")).to_have_text(
            "orders (key 'bad'): 2 event(s) handled, 0 still parked"
        )
        expect(orders.locator("tr.letter")).to_have_count(0)
        expect(orders.locator(".badge.health")).to_have_text("healthy")

        # Discard a parked record: cancelled first (nothing happens), then confirmed.
        parked = ingestor.locator('tr.letter[data-key="r-bad"]')
        _open(page, parked.get_by_role("button", name="discard"))
        page.keyboard.press("Escape")
        expect(page.locator("#action-dialog")).to_be_hidden()
        assert len(app.dead_letter_list("readings-in")) == 1
        _open(page, parked.get_by_role("button", name="discard"))
        page.click("#action-confirm")
        expect(page.locator("#message")).to_have_text(
            "readings-in (key 'r-bad'): discarded 1 event(s)"
        )
        assert app.dead_letter_list("readings-in") == []

        # Split where it applies: the running owner splits the segment chosen.
        _open(page, orders.get_by_role("button", name="split…"))
        page.select_option("#action-segment", "1")
        page.click("#action-confirm")
        expect(page.locator("#message")).to_contain_text("orders: split of 1/1 done by its owner")
        assert sorted(str(s.segment) for s in app.status("orders").segments) == [
            "0/1", "1/3", "3/3"
        ]  # fmt: skip
        expect(orders.locator("table.segments tbody tr")).to_have_count(3)

        # Reset shows app.reset_plan before it asks; refused while the processor runs.
        _open(page, orders.get_by_role("button", name="reset…"))
        page.click("#action-confirm")  # "Show what it does"
        expect(page.locator("#action-plan")).to_contain_text("orders is running")
        expect(page.locator("#action-confirm")).to_be_disabled()
        page.click("#action-cancel")
        plan = app.reset_plan("audit", 5)
        _open(page, audit.get_by_role("button", name="reset…"))
        page.fill("#action-to", "5")
        page.click("#action-confirm")
        expect(page.locator("#action-plan")).to_contain_text(plan.summary())
        page.click("#action-confirm")
        expect(page.locator("#message")).to_have_text(
            "audit: reset; continues from position 5 on the next run"
        )
        assert {s.position for s in app.status("audit").segments} == {5}

        # Versions: version 2 catches up (on a node of its own) and is promoted in a dialog;
        # version 1 then offers retire, refused as on the command line while it runs.
        other = make_app(env["EVENTLANES_TEST_OPS_URL"], str(flag))
        run_until_caught_up(other, processors=["orders@v2"])
        other.close()
        _open(page, v2.get_by_role("button", name="promote"))
        page.click("#action-confirm")
        expect(page.locator("#message")).to_have_text(
            "orders@v2: promoted; readers of 'orders' now see version 2 (was version 1)"
        )
        expect(v2.locator(".badge.version")).to_have_text("version 2 of orders: serving")
        expect(orders.locator(".badge.version")).to_contain_text("version 1 of orders: not serving")
        _open(page, orders.get_by_role("button", name="retire…"))
        page.click("#action-confirm")  # "Show what it does"
        expect(page.locator("#action-error")).to_contain_text(
            "cannot retire 'orders': it is still running"
        )
        page.click("#action-cancel")
        assert not app.tokens.retired("orders")
    assert TOKEN not in served.output


def test_actions_without_the_right_token_are_refused_and_change_nothing(
    world, tmp_path: Path
) -> None:
    app, flag, env = world
    flag.touch()  # a retry would now succeed: a refusal is the only reason nothing changes
    before = app.dead_letter_list("orders")
    assert len(before) == 2
    retry = "api/processors/orders/retry"
    with dashboard(env) as served:
        url = served.base + retry
        for headers in ({}, {"authorization": "Bearer wrong-token-of-the-same-size-xx"},
                        {"authorization": f"Basic {TOKEN}"},
                        {"authorization": f"Bearer {TOKEN}x"}):  # fmt: skip
            assert _post(url, {"key": "bad"}, headers) == 401
        assert _post(served.base + "api/processors/orders/reset-plan", {}) == 401
        operator = {"authorization": f"Bearer {TOKEN}"}
        assert _post(served.base + "api/processors/orders/explode", {}, operator) == 400
        assert _post(served.base + "api/processors/nothing/retry", {}, operator) == 400
        assert _post(served.base + "api/processors/readings-in/split", {}, operator) == 400
        assert app.dead_letter_list("orders") == before
        with browser(tmp_path) as page:
            page.goto(served.base)
            row = page.locator('#processor-orders tr.letter[data-key="bad"]')
            _open(page, row.get_by_role("button", name="retry"), "not-the-operator-token")
            page.click("#action-confirm")
            expect(page.locator("#action-error")).to_have_text("refused: no or wrong token")
            expect(page.locator("#token-field")).to_be_visible()  # asked again
            page.click("#action-cancel")
        assert app.dead_letter_list("orders") == before
        page_html = urllib.request.urlopen(served.base, timeout=10).read().decode()
        assert TOKEN not in page_html
    assert TOKEN not in served.output
    assert "refused retry of orders" in served.output

    # No token set: read-only, it says so, and every action is refused (403).
    with dashboard(env, token=None) as served, browser(tmp_path) as page:
        page.goto(served.base)
        expect(page.locator("#access")).to_contain_text("Read-only: no token is set")
        expect(page.locator("#processor-orders tr.letter")).to_have_count(1)
        expect(page.locator("button[data-action]")).to_have_count(0)
        for what in ("retry", "discard", "reset", "pause"):
            url = served.base + f"api/processors/orders/{what}"
            assert _post(url, {"key": "bad"}, {"authorization": f"Bearer {TOKEN}"}) == 403
    assert app.dead_letter_list("orders") == before
    assert not app.tokens.is_paused("orders")


def test_behind_a_reverse_proxy_under_a_path_prefix(world, tmp_path: Path) -> None:
    """Every asset and call goes through the prefix; an action works through the proxy."""
    app, flag, env = world
    prefix = "/ops/eventlanes/"
    with dashboard(env) as served:
        port = _free_port()
        proxy = subprocess.Popen(
            [sys.executable, "-m", "tests.prefix_proxy", str(port), prefix, served.base],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        proxied = Served(proxy, f"http://127.0.0.1:{port}{prefix}")
        try:
            assert proxy.stdout is not None and proxy.stdout.readline().strip() == "ready"
            with browser(tmp_path) as page:
                seen: list[tuple[str, int]] = []
                failed: list[str] = []
                page.on("response", lambda r: seen.append((r.url, r.status)))
                page.on("requestfailed", lambda r: failed.append(r.url))
                page.goto(proxied.base)
                expect(page.locator("#processor-orders")).to_be_visible()
                # The stylesheet applied, the script ran (it refreshed the body).
                background = page.evaluate("getComputedStyle(document.body).backgroundColor")
                assert background == "rgb(246, 247, 249)"
                with page.expect_response(proxied.base + "fragment", timeout=10_000):
                    pass
                flag.touch()
                row = page.locator('#processor-orders tr.letter[data-key="bad"]')
                _open(page, row.get_by_role("button", name="retry"), TOKEN)
                page.click("#action-confirm")
                expect(page.locator("#message")).to_have_text(
                    "orders (key 'bad'): 2 event(s) handled, 0 still parked"
                )
                assert failed == []
                assert seen and all(u.startswith(proxied.base) for u, _ in seen), seen
                assert all(status < 400 for _, status in seen), seen
                loaded = {u[len(proxied.base) :] for u, _ in seen}
                assert {"", "static/dashboard.css", "static/dashboard.js", "fragment",
                        "api/processors/orders/retry"} <= loaded  # fmt: skip
        finally:
            proxied.stop()
    assert app.dead_letter_list("orders") == []
