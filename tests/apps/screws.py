"""The screw-fastening pipeline (the KUKA article), for tests and worker processes.

RawScrews --normalise (republisher)--> ScrewsFastened --screws-per-robot (aggregation)-->
state {ok, failed} per robot --(fold outputs)--> per-factory totals (a downstream stage).
The republisher pauses after each append (EVENTLANES_TEST_PAUSE seconds) to widen the window
in which a SIGKILL leaves appended outputs without a committed token.
"""

from __future__ import annotations

import os
import time

import eventlanes as el

env = os.environ.get
URL = env("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db")
PAUSE = float(env("EVENTLANES_TEST_PAUSE", "0"))
app = el.App(URL, claim_timeout=float(env("EVENTLANES_TEST_APP_CLAIM_TIMEOUT", "1.5")))


class _PausingStore:
    """Appends, then pauses: a crash there re-appends the same outputs on restart."""

    def __init__(self, store: el.EventStore) -> None:
        self._store = store

    def append(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        positions = self._store.append(*args, **kwargs)
        time.sleep(PAUSE)
        return positions


def build(app: el.App) -> tuple[el.Republisher, el.Aggregation, el.Stage]:
    """Define the pipeline on ``app``."""
    normalise = app.republisher(
        "normalise", to_stream=lambda e: f"robot-{e.data['robot']}", segments=2, batch_size=50
    )
    screws = app.aggregation(
        "screws-per-robot",
        key=lambda e: e.data["robot"],
        initial=lambda: {"ok": 0, "failed": 0},
        persist_every=0.2,
        segments=2,
    )
    factories = screws.downstream(
        "screws-per-factory", key=lambda out: out.data["factory"], initial=lambda: {"ok": 0}
    )

    @normalise.on("RawScrews")
    def split_results(event: el.Event) -> list[el.NewEvent]:
        """A flat map: one raw reading becomes one event per screw result."""
        robot = event.data["robot"]
        return [
            el.NewEvent("ScrewsFastened", {"robot": robot, "ok": ok, "failed": failed})
            for ok, failed in event.data["results"]
        ]

    @screws.on("ScrewsFastened")
    def add(state: dict, event: el.Event) -> el.NewEvent:
        state["ok"] += event.data["ok"]
        state["failed"] += event.data["failed"]
        factory = f"factory-{event.data['robot'] % 3}"
        return el.NewEvent("RobotOk", {"factory": factory, "ok": event.data["ok"]})

    @factories.on("RobotOk")
    def add_factory(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]

    return normalise, screws, factories


normalise, screws, factories = build(app)


def install_pause() -> None:
    """Worker processes: make the republisher pause after appending."""
    if PAUSE:
        worker_store = el.open_store(URL)
        normalise.to_store = _PausingStore(worker_store)  # type: ignore[assignment]


install_pause()
