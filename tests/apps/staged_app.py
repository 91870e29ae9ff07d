"""A test app whose Spark replays stage their states in parts of a few states each (many parts
from little data), for the tests that kill a replay while it stages
(EVENTLANES_TEST_APP_URL selects the store)."""

from __future__ import annotations

import os

import eventlanes as el
import eventlanes.spark.staging

eventlanes.spark.staging.PART = 3

app = el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"), claim_timeout=3)
app.aggregation("counts", key="robot", on="Fastened", fields={"n": el.count(), "ok": el.sum("ok")})
