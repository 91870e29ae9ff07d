"""The screw-fastening pipeline (exactly-once for non-idempotent sums), used by `make demo`
and the tests: `eventlanes run examples.screws:app --processes 2`.

RawScrews --normalise (republisher)--> ScrewsFastened --screws-per-robot (aggregation)-->
{ok, failed} per robot --(fold outputs)--> per-factory totals (a downstream stage).

EVENTLANES_DEMO_PAUSE (seconds) makes the republisher pause after each append, standing in for
a slow write to another system: it widens the window in which a crash leaves appended outputs
without a committed token, so that a restart appends them again and the sums must drop them.
EVENTLANES_DEMO_CRASH_AFTER=N makes a worker kill itself (SIGKILL) right after its N-th append,
before the token commits: the crash window, forced, so the demo always has duplicates to drop.
"""

from __future__ import annotations

import os
import random
import signal
import time

import eventlanes as el

env = os.environ.get
URL = env("EVENTLANES_DEMO_URL", "sqlite:///demo-data/demo.db")
PAUSE = float(env("EVENTLANES_DEMO_PAUSE", "0"))
CRASH_AFTER = int(env("EVENTLANES_DEMO_CRASH_AFTER", "0"))
app = el.App(URL, claim_timeout=1.5)


class _PausingStore:
    """Appends, then pauses: a crash there re-appends the same outputs on restart."""

    def __init__(self, store: el.EventStore) -> None:
        self._store = store
        self._appends = 0

    def append(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        positions = self._store.append(*args, **kwargs)
        self._appends += 1
        if CRASH_AFTER and self._appends == CRASH_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)  # appended, token not committed
        time.sleep(PAUSE)
        return positions


def build(app: el.App) -> tuple[el.Republisher, el.Aggregation, el.Stage]:
    """Define the pipeline on ``app``."""
    normalise = app.republisher(
        "normalise", to_stream=lambda e: f"robot-{e.data['robot']}", segments=2, batch_size=50
    )
    screws = app.aggregation(
        "screws-per-robot",
        key=lambda e: str(e.data["robot"]),  # robots are numbered: a key is text
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


def append_raw(store: el.EventStore, n: int, seed: int) -> dict:
    """Append ``n`` raw readings; return the exact totals they must add up to."""
    rng = random.Random(seed)
    robots: dict[int, dict[str, int]] = {}
    factories: dict[str, dict[str, int]] = {}
    outputs = 0
    for i in range(n):
        robot = rng.randrange(6)
        results = [[rng.randrange(9), rng.randrange(2)] for _ in range(rng.randint(1, 3))]
        store.append(
            f"raw-{i % 4}", [el.NewEvent("RawScrews", {"robot": robot, "results": results})]
        )
        r = robots.setdefault(robot, {"ok": 0, "failed": 0})
        f = factories.setdefault(f"factory-{robot % 3}", {"ok": 0})
        for ok, failed in results:
            r["ok"] += ok
            r["failed"] += failed
            f["ok"] += ok
            outputs += 1
    return {"robots": robots, "factories": factories, "outputs": outputs}


def install_pause() -> None:
    """Worker processes: make the republisher pause after appending."""
    if PAUSE or CRASH_AFTER:
        worker_store = el.open_store(URL)
        normalise.to_store = _PausingStore(worker_store)  # type: ignore[assignment]


install_pause()
