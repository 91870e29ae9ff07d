"""The dashboard's parts without a browser: the rates it counts from its polls (on SQLite and
PostgreSQL), the ETA, the bounded history, the charts, the operator token, the command line's
refusals, and the store URL it shows."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.admin.health import MaxLag
from eventlanes.cli import main
from eventlanes.dashboard.auth import MIN_LENGTH, load_auth
from eventlanes.dashboard.charts import chart
from eventlanes.dashboard.history import History, Sample, eta
from eventlanes.dashboard.page import plain, snapshot
from eventlanes.dashboard.server import event_counter
from eventlanes.db.url import parse_url
from tests.processing_helpers import run_until_caught_up

pytest.importorskip("starlette")


def _handled(history: History, name: str, since: float) -> float:
    """Events handled after ``since``, summed from the samples' rates."""
    samples = history.samples(name)
    previous = max(s.at for s in samples if s.at <= since)
    total = 0.0
    for s in samples:
        if s.at > since:
            assert s.rate is not None, s
            total += s.rate * (s.at - previous)
            previous = s.at
    return total


def test_rates_count_the_events_each_segment_handled(store_url: str) -> None:
    """Keys spread unevenly over 4 segments (one hot key), a split between polls, events of
    other processors' streams in between: the rates add up to exactly the events handled; a
    reset leaves a gap."""
    app = el.App(store_url)
    proc = app.processor("p", segments=4)
    proc.on_any(lambda event, ctx: None)
    count = event_counter(app)
    history = History(interval=1.0)
    at = 1000.0

    def poll() -> float:
        nonlocal at
        at += 2.0
        history.record(snapshot(app), at, count)
        return at

    first = poll()  # never run: the segments it would start with
    app.store.append("hot", [el.NewEvent("E")] * 70)
    for i in range(30):
        app.store.append(f"k-{i}", [el.NewEvent("E")])
    run_until_caught_up(app)
    poll()
    assert _handled(history, "p", first) == pytest.approx(100.0)

    second = poll()
    app.split("p", 1)  # 1/3 -> 1/7 and 5/7: both halves count from 1/3's position
    for i in range(50):
        app.store.append(f"j-{i}", [el.NewEvent("E")])
    run_until_caught_up(app)
    poll()
    assert len(app.status("p").segments) == 5
    assert _handled(history, "p", second) == pytest.approx(50.0)
    assert history.summary("p", at)["eta"]["state"] == "caught-up"

    app.reset("p", "tail")
    poll()
    assert history.samples("p")[-1].rate is None  # positions went back: no rate, a gap
    app.close()


def test_eta_from_the_lag_trend() -> None:
    falling = [Sample(100.0 + t, 5.0, 1000 - 10 * t, 1.0) for t in range(0, 30, 2)]
    now = falling[-1].at
    got = eta(falling, now)
    assert got["state"] == "eta" and got["seconds"] == pytest.approx(falling[-1].lag / 10)
    assert got["text"] == "ETA 1 min 12 s"
    growing = [Sample(100.0 + t, 1.0, 100 + 3 * t, 1.0) for t in range(0, 30, 2)]
    assert eta(growing, now)["state"] == "behind"
    assert eta(growing, now)["text"] == "falling behind (+3.0/s)"
    assert eta([*falling, Sample(now + 1, 9.0, 0, 0.0)], now + 1)["text"] == "caught up"
    assert eta(falling, now + 1000)["state"] == "unknown"  # nothing recent


def test_history_is_bounded() -> None:
    history = History(interval=0.5, seconds=60)
    doc = {"processors": [{"name": "p", "lag_events": 0, "lag_seconds": 0.0,
                           "segments": [{"id": 0, "mask": 0, "position": 0}]}]}  # fmt: skip
    for i in range(10 * history.maxlen):
        doc["processors"][0]["segments"][0]["position"] = i
        history.record(doc, float(i), lambda after, upto: upto - after)
    samples = history.samples("p")
    assert len(samples) == history.maxlen == 121
    assert all(s.rate == pytest.approx(1.0) for s in samples)


def test_chart_breaks_its_line_where_the_rate_is_unknown() -> None:
    points = [(0.0, 1.0), (10.0, 2.0), (20.0, None), (30.0, 4.0), (40.0, 2.0)]
    c = chart(points, now=40.0, longest=600.0, threshold=8.0)
    assert c.line.count("M") == 2 and c.area.count("Z") == 2
    assert c.span == 60.0  # at least a minute
    assert c.peak == 4.0 and c.top == pytest.approx(8.8)  # room for the threshold line
    assert c.threshold == pytest.approx(48 * (1 - 8 / 8.8), abs=0.1)
    assert chart([], now=0.0, longest=600.0).empty


def test_the_operator_token(tmp_path) -> None:
    good = "x" * MIN_LENGTH
    auth = load_auth(environ={"EVENTLANES_DASHBOARD_TOKEN": good})
    assert not auth.read_only and auth.source == "$EVENTLANES_DASHBOARD_TOKEN"
    assert auth.allows(f"Bearer {good}") and auth.allows(f"bearer {good}")
    for wrong in (None, "", good, f"Basic {good}", f"Bearer {good}x", "Bearer " + "y" * 16):
        assert not auth.allows(wrong)
    assert good not in repr(auth)
    assert load_auth(environ={}).read_only and not load_auth(environ={}).allows(f"Bearer {good}")
    path = tmp_path / "token"
    path.write_text(good + "\n")
    assert load_auth(str(path), environ={}).allows(f"Bearer {good}")
    with pytest.raises(el.InvalidInputError, match="given twice"):
        load_auth(str(path), environ={"EVENTLANES_DASHBOARD_TOKEN": good})
    with pytest.raises(el.InvalidInputError, match="is 5 characters: use at least 16"):
        load_auth(environ={"EVENTLANES_DASHBOARD_TOKEN": "short"})
    path.write_text("\n")
    with pytest.raises(el.InvalidInputError, match="is empty"):
        load_auth(str(path), environ={})
    with pytest.raises(el.InvalidInputError, match="cannot read the dashboard token file"):
        load_auth(str(tmp_path / "missing"), environ={})


@pytest.mark.parametrize(
    ("args", "env", "error"),
    [
        (["--max-lag", "soon"], {}, "invalid --max-lag 'soon'"),
        (["--refresh", "0"], {}, "--refresh must be at least 0.1 seconds"),
        (["--token-file", "/nonexistent/token"], {}, "cannot read the dashboard token file"),
        ([], {"EVENTLANES_DASHBOARD_TOKEN": "short"}, "use at least 16"),
    ],
)
def test_dashboard_command_refuses_bad_options(args, env, error, monkeypatch) -> None:
    monkeypatch.delenv("EVENTLANES_DASHBOARD_TOKEN", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(main, ["dashboard", "tests.apps.ops_app:app", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and error in result.output.replace("\n", " ")
    assert "short" not in result.output or "short" in error  # a token is never echoed


def test_api_status_is_the_status_document(tmp_path) -> None:
    """The page's extra keys are removed: what `status --json` prints, field for field."""
    from eventlanes.admin.health import processor_document, status_document, store_first_after

    app = el.App(f"sqlite:///{tmp_path}/e.db")
    app.processor("p").on_any(lambda event, ctx: None)
    app.store.append("s", [el.NewEvent("E")] * 3)
    limit = MaxLag(events=1)
    page = snapshot(app, limit)
    doc = status_document([processor_document(app.status("p"), store_first_after(app.store),
                                              limit)], limit)  # fmt: skip
    ours = plain(page)
    assert set(ours["processors"][0]) == set(doc["processors"][0])
    assert (
        ours["processors"][0]["problems"]
        == doc["processors"][0]["problems"]
        == ["lag 3 events > --max-lag 1"]
    )
    assert page["processors"][0]["guarantee"] == "exactly-once"
    app.close()


def test_store_urls_are_shown_without_secrets() -> None:
    hidden = {
        "postgresql://app:s3cret@db/shop?prefix=el_": "postgresql://app:***@db/shop?prefix=el_",
        "postgresql://app@db/shop?password=s3cret&sslmode=require":
            "postgresql://app@db/shop?password=***&sslmode=require",
        "postgresql://app@db/shop?sslpassword=s3cret": "postgresql://app@db/shop?sslpassword=***",
        "postgresql://app@db/shop?pass%77ord=s3cret": "postgresql://app@db/shop?pass%77ord=***",
        "sqlite:///tmp/shop.db": "sqlite:///tmp/shop.db",
    }  # fmt: skip
    for url, shown in hidden.items():
        assert parse_url(url).redacted == shown
