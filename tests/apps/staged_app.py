"""A test app whose Spark replays stage their states in parts of a few states each (many parts
from little data), for the tests that kill a replay while it stages
(EVENTLANES_TEST_APP_URL selects the store), and that can kill itself between a Delta
table's commit and the store's (EVENTLANES_TEST_KILL_BEFORE_MOVE)."""

from __future__ import annotations

import os
import signal
from typing import Any

import eventlanes as el
import eventlanes.spark.staging
from eventlanes.processing.tables.staging import StagedStates

eventlanes.spark.staging.PART = 3

if os.environ.get("EVENTLANES_TEST_KILL_BEFORE_MOVE"):  # SIGKILL once the Delta table is written

    def _killed(self: StagedStates, *args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    StagedStates.replace = _killed  # type: ignore[method-assign,assignment]

app = el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"), claim_timeout=3)
app.aggregation("counts", key="robot", on="Fastened", fields={"n": el.count(), "ok": el.sum("ok")})
