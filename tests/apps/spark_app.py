"""A test app for the Spark continuous engine (EVENTLANES_TEST_APP_URL selects the store)."""

from __future__ import annotations

import os

import eventlanes as el

app = el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"), claim_timeout=3)
screws = app.aggregation(
    "screws", key=lambda e: e.data["robot"], initial=lambda: {"ok": 0, "n": 0}, segments=2
)


@screws.on("ScrewsFastened")
def add(state: dict, event: el.Event) -> None:
    state["ok"] += event.data["ok"]
    state["n"] += 1
