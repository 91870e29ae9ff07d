"""The dashboard's test app: everything the page shows at once.

ops_app's processors (``orders`` parks the events of stream ``bad`` until the flag file exists,
``billing`` fails its segment on them, ``audit`` is never run: it lags), a version 2 of
``orders`` (never run: not serving) and, when a broker is named, a Kafka ingestor
``readings-in`` whose records that are not JSON are parked. For ``eventlanes dashboard``:
EVENTLANES_TEST_OPS_URL, EVENTLANES_TEST_OPS_FLAG, EVENTLANES_TEST_DASH_BOOTSTRAP and
EVENTLANES_TEST_DASH_TOPIC.
"""

from __future__ import annotations

import os

import eventlanes as el
from tests.apps import ops_app


def make_app(
    url: str, flag: str | None = None, bootstrap: str | None = None, topic: str | None = None
) -> el.App:
    app = ops_app.make_app(url, flag)
    v2 = app.processor("orders", version=2, segments=1)

    @v2.on_any
    def noted(event: el.Event, ctx: el.Context) -> None:
        pass

    if bootstrap:
        kafka = el.Kafka(bootstrap, timeout=10)
        app.ingest(
            "readings-in", kafka, topic=topic or "readings", type="Reading", on_bad="dead_letter"
        )
    return app


app = make_app(
    os.environ.get("EVENTLANES_TEST_OPS_URL", "sqlite:////nonexistent/ops.db"),  # fails on use
    os.environ.get("EVENTLANES_TEST_OPS_FLAG"),
    os.environ.get("EVENTLANES_TEST_DASH_BOOTSTRAP"),
    os.environ.get("EVENTLANES_TEST_DASH_TOPIC"),
)
