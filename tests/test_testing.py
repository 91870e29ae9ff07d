"""eventlanes.testing: what a team needs to test its own processors, and the caught-up wait it
relies on."""

from __future__ import annotations

import time

import pytest

import eventlanes as el
from eventlanes.testing import ProcessorFailed, given, rows, run_until_caught_up, states
from tests.apps.shop import build

E = el.NewEvent


def test_caught_up_waits_for_every_source_of_a_processor(store_url: str, tmp_path) -> None:
    """A processor that reads another store besides the app's own: caught up means every
    source's head reached. The wait returned at once when the app's own store was empty (its
    own head reached), with the other source's events not handled yet."""
    legacy_url = f"sqlite:///{tmp_path}/legacy.db"
    with el.open_store(legacy_url) as legacy:
        for i in range(30):
            legacy.append(f"s-{i % 7}", [E("Imported")])
    app = el.App(store_url)
    proc = app.processor("merged", segments=2, batch_size=4, sources={"legacy": legacy_url})
    handled: list[int] = []

    @proc.on_any
    def slow(event: el.Event, ctx: el.Context) -> None:
        time.sleep(0.02)  # slow enough that returning early cannot go unseen
        handled.append(event.position)

    app.start()
    try:
        app.wait_until_caught_up(60)
        seen = len(handled)
    finally:
        app.stop()
        app.close()
    assert seen == len(set(handled)) == 30


# -- the way a team tests its own processors (docs/how-to/testing.md) ------------------------------
@pytest.fixture
def shop(eventlanes_url: str):
    """The team's app on a fresh store: SQLite and PostgreSQL (the plugin's fixture)."""
    app = build(eventlanes_url)
    yield app
    app.close()


def test_order_lines_totals_and_receipts(shop: el.App) -> None:
    given(
        shop,
        {
            "order-1": [
                E("Placed", {"email": "a@example.com"}),
                E("LineAdded", {"sku": "wheel", "qty": 2}),
                E("LineAdded", {"sku": "bell", "qty": 1}),
                E("LineRemoved", {"sku": "bell"}),
            ],
            "order-2": [
                E("Placed", {"email": "b@example.com"}),
                E("LineAdded", {"sku": "wheel", "qty": 1}),
            ],
        },
    )
    run_until_caught_up(shop)
    lines = f"SELECT order_id, sku, qty FROM {shop.db.table('order_lines')} ORDER BY order_id"
    assert rows(shop, lines) == [("order-1", "wheel", 2), ("order-2", "wheel", 1)]
    assert states(shop, "order-totals") == {
        "wheel": {"lines": 2, "qty": 3},
        "bell": {"lines": 1, "qty": 1},
    }
    receipts = f"SELECT order_id FROM {shop.db.table('receipts')} WHERE order_id = ?"
    assert rows(shop, receipts, ("order-2",)) == [("order-2",)]
    # A reset replays the lines (rebuilt, not doubled) and sends no receipt again.
    shop.reset("order-lines")
    shop.reset("receipts")
    given(shop, [("order-3", E("Placed", {"email": "c@example.com"}))])
    run_until_caught_up(shop, "order-lines", "receipts")
    assert rows(shop, lines) == [("order-1", "wheel", 2), ("order-2", "wheel", 1)]
    sent = rows(shop, f"SELECT order_id FROM {shop.db.table('receipts')} ORDER BY order_id")
    assert sent == [("order-1",), ("order-2",), ("order-3",)]


def test_a_failing_handler_fails_the_run_at_once_with_its_error(shop: el.App) -> None:
    given(shop, [("order-9", E("Placed", {}))])
    started = time.monotonic()
    with pytest.raises(ProcessorFailed, match="order order-9 has no e-mail address"):
        run_until_caught_up(shop, "receipts", timeout=60)
    assert time.monotonic() - started < 30  # not the timeout: the error, as soon as it shows


def test_parked_events_fail_the_run_unless_expected(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/parked.db")
    proc = app.processor("strict", on_error="dead_letter")

    @proc.on("Bad")
    def refuse(event: el.Event, ctx: el.Context) -> None:
        raise RuntimeError("refused")

    given(app, {"s": [E("Bad")]})
    with pytest.raises(ProcessorFailed, match="event 1: .*RuntimeError: refused"):
        run_until_caught_up(app)
    run_until_caught_up(app, dead_letters=True)  # parked on purpose: the test says so
    with pytest.raises(el.InvalidInputError, match="unknown processor 'nope'"):
        run_until_caught_up(app, "nope")
    assert not app.running
    app.close()


def test_the_plugin_in_a_project_of_its_own(tmp_path) -> None:
    """A project that loads the plugin from its conftest, as the docs say: its test runs on
    the backends asked for; an unknown backend is a usage error naming it."""
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text('pytest_plugins = ["eventlanes.testing.pytest_plugin"]\n')
    (tmp_path / "test_mine.py").write_text(
        "import eventlanes as el\n"
        "from eventlanes.testing import given, rows, run_until_caught_up\n\n"
        "def test_counts(eventlanes_url, eventlanes_backend):\n"
        "    app = el.App(eventlanes_url)\n"
        "    t = app.db.table('seen')\n"
        "    app.db.run_ddl([f'CREATE TABLE {t} (position BIGINT)'])\n"
        "    p = app.processor('counter')\n"
        "    p.on_any(lambda e, ctx: ctx.execute(f'INSERT INTO {t} VALUES ({ctx.param})', "
        "(e.position,)))\n"
        "    given(app, {'s': [el.NewEvent('A'), el.NewEvent('B')]})\n"
        "    run_until_caught_up(app)\n"
        "    assert rows(app, f'SELECT count(*) FROM {t}') == [(2,)]\n"
        "    assert eventlanes_backend == 'sqlite'\n"
        "    app.close()\n"
    )

    def pytest_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    done = pytest_run("--eventlanes-backends=sqlite")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    wrong = pytest_run("--eventlanes-backends=sqlite,mysql")
    assert wrong.returncode == 4 and "unknown backend(s) mysql" in wrong.stderr, wrong.stderr
