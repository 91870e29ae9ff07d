"""A test app with a session-windowed Python fold, for replays in processes of their own:
``eventlanes replay tests.apps.sessions_app:app sessions`` with EVENTLANES_TEST_APP_URL."""

from __future__ import annotations

import os

import eventlanes as el


def define(app: el.App, name: str) -> el.Aggregation:
    """Robots' screw attempts per session (a minute without one ends it), by the robot's own
    timestamp (ms), kept long after they close; the merge function is this module's, shipped
    to the executors."""
    agg = app.aggregation(
        name, key="robot", initial=lambda: {"ok": 0, "failed": 0}, window=el.session(gap="1m"),
        time=el.event_time("ts", unit="ms"), lateness="30s", segments=2, retain="40000d",
    )  # fmt: skip

    @agg.on("ScrewAttempted")
    def add(state: dict, event: el.Event) -> None:
        state["ok" if event.data["ok"] else "failed"] += 1

    @agg.on_merge
    def merge(into: dict, other: dict) -> None:
        into["ok"] += other["ok"]
        into["failed"] += other["failed"]

    return agg


app = el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unused.db"))
sessions = define(app, "sessions")
