"""A test app with windowed aggregations, for worker processes killed mid-run:
``eventlanes run tests.apps.windows_app:app`` with EVENTLANES_TEST_APP_URL (required) and
EVENTLANES_TEST_APP_SEGMENTS (default 3)."""

from __future__ import annotations

import os

import eventlanes as el

env = os.environ.get


def define(app: el.App, name: str, segments: int, **windowing: object) -> el.Aggregation:
    """Robots' screw attempts counted per minute by the robot's own timestamp (ms)."""
    agg = app.aggregation(
        name, key="robot", initial=lambda: {"ok": 0, "failed": 0}, window=el.tumbling("1m"),
        time=el.event_time("ts", unit="ms"), lateness="30s", segments=segments,
        persist_every=0.05, batch_size=40, **windowing,
    )  # fmt: skip

    @agg.on("ScrewAttempted")
    def add(state: dict, event: el.Event) -> None:
        state["ok" if event.data["ok"] else "failed"] += 1

    return agg


app = el.App(env("EVENTLANES_TEST_APP_URL", "sqlite:///unused.db"), claim_timeout=1.5)
screws = define(app, "screws", int(env("EVENTLANES_TEST_APP_SEGMENTS", "3")))
