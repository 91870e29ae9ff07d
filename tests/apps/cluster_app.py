"""A test app for the Spark cluster tests (EVENTLANES_TEST_APP_URL selects the store).

Its functions live in this module, which the cluster's executors cannot import unless Spark
ships it: ``totals`` keys by a data property (extracted in the JVM), ``by_function`` by a
Python function (run on the executors), ``recorder`` is a transactional projection.
"""

from __future__ import annotations

import os

import eventlanes as el
import eventlanes.spark.staging
from tests.apps.recorder import create_schema

# Parts of at most about 100 states: the cluster's and Spark Connect's replays of a few hundred
# keys take the driver's bounded parts (states kept on the executors, counted, collected by
# hash bucket), as a replay of many keys does.
eventlanes.spark.staging.PART = 100


def add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1
    state["last"] = event.position  # order-sensitive: the last event folded wins


def initial() -> dict:
    return {"sum": 0, "n": 0, "last": 0}


def record(event: el.Event, ctx: el.Context) -> None:
    p = ctx.param
    ctx.execute(
        f"INSERT INTO {ctx.table('handled')} (stream_id, version, position, replay) "
        f"VALUES ({p}, {p}, {p}, {p})",
        (event.stream_id, event.version, event.position, int(ctx.is_replay)),
    )


def clear(ctx: el.Context) -> None:
    ctx.execute(f"DELETE FROM {ctx.table('handled')}")


def define(app: el.App) -> el.App:
    app.aggregation("totals", key="k", initial=initial, segments=4).on("Measured")(add)
    by_function = app.aggregation("by_function", key=lambda e: e.data["k"], initial=initial,
                                  segments=2)  # fmt: skip
    by_function.on("Measured")(add)
    recorder = app.processor("recorder", segments=4)
    recorder.on_any(record)
    recorder.on_reset(clear)
    return app


app = define(el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"),
                    claim_timeout=5))  # fmt: skip

__all__ = ["app", "create_schema", "define"]
