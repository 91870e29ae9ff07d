"""A test app for worker processes: records every handled event, once, in handling order.

Configured by environment variables so that `eventlanes run tests.apps.recorder:app` works in
subprocesses: EVENTLANES_TEST_APP_URL (required), _SEGMENTS, _MODE, _CLAIM_TIMEOUT, _BATCH,
_LOG_BYTES, _EXIT_SLEEP (seconds a worker process of `run --processes` sleeps on exit, after
saying "exiting" on stderr).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time

import eventlanes as el
from tests.processing_helpers import serial_pk

env = os.environ.get
_EXIT_SLEEP = float(env("EVENTLANES_TEST_APP_EXIT_SLEEP", "0"))


class _SlowExit:
    """Freed when Python tears this module down, the last thing a process does: after its
    signal handlers are gone (what it leaves set is what holds then)."""

    def __del__(self) -> None:
        sys.stderr.write(f"exiting {os.getpid()}\n")
        sys.stderr.flush()
        time.sleep(_EXIT_SLEEP)


if _EXIT_SLEEP and multiprocessing.parent_process() is not None:  # in worker processes
    _slow_exit = _SlowExit()

app = el.App(
    env("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"),
    claim_timeout=float(env("EVENTLANES_TEST_APP_CLAIM_TIMEOUT", "2")),
)
recorder = app.processor(
    "recorder",
    segments=int(env("EVENTLANES_TEST_APP_SEGMENTS", "4")),
    mode=env("EVENTLANES_TEST_APP_MODE", "pooled"),
    batch_size=int(env("EVENTLANES_TEST_APP_BATCH", "200")),
)


def create_schema(app: el.App) -> str:
    """The projection table; its serial id gives the order events were handled in."""
    table = app.db.table("handled")
    serial = serial_pk(app.db)
    app.db.run_ddl(
        [
            f"""CREATE TABLE IF NOT EXISTS {table} (
                id {serial}, stream_id TEXT NOT NULL, version BIGINT NOT NULL,
                position BIGINT NOT NULL, replay INTEGER NOT NULL DEFAULT 0)"""
        ]
    )
    return table


def clear(ctx: el.Context) -> None:
    """An on_reset handler: the projection table emptied (a replay rebuilds it)."""
    ctx.execute(f"DELETE FROM {ctx.table('handled')}")


_LOG = int(env("EVENTLANES_TEST_APP_LOG_BYTES", "0"))  # a log record of this size per event
log = logging.getLogger("tests.recorder")


@recorder.on_any
def record(event: el.Event, ctx: el.Context) -> None:
    if _LOG:
        log.warning("handled %s %s", event.position, "x" * _LOG)
    p = ctx.param
    ctx.execute(
        f"INSERT INTO {ctx.table('handled')} (stream_id, version, position, replay) "
        f"VALUES ({p}, {p}, {p}, {p})",
        (event.stream_id, event.version, event.position, int(ctx.is_replay)),
    )


@el.disallow_replay
def mail(event: el.Event, ctx: el.Context) -> None:
    """A side effect that must happen once per event, never on a replay (its table: mails)."""
    ctx.execute(
        f"INSERT INTO {ctx.table('mails')} (position) VALUES ({ctx.param})", (event.position,)
    )
