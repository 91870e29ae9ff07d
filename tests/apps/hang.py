"""A test app whose handler hangs at one position until a file appears (a hung handler).

EVENTLANES_TEST_APP_URL: the store; EVENTLANES_TEST_HANG_AT: the position that hangs;
EVENTLANES_TEST_HANG_UNTIL: the file whose existence lets it finish;
EVENTLANES_TEST_HANG_STARTED (optional): a file it creates once it hangs;
EVENTLANES_TEST_BLOCK_SIGTERM (optional): SIGTERM blocked in every thread of a worker process
(a worker that cannot stop).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import eventlanes as el

env = os.environ.get
if env("EVENTLANES_TEST_BLOCK_SIGTERM") and multiprocessing.parent_process() is not None:
    # a worker (not its supervisor) deaf to its stop: every thread started from here
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
app = el.App(env("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"), claim_timeout=2)
proc = app.processor("hang", handler_timeout=float(env("EVENTLANES_TEST_HANG_TIMEOUT", "60")))


@proc.on_any
def maybe_hang(event: el.Event, ctx: el.Context) -> None:
    if event.position == int(env("EVENTLANES_TEST_HANG_AT", "0")):
        until = env("EVENTLANES_TEST_HANG_UNTIL", "")
        if started := env("EVENTLANES_TEST_HANG_STARTED", ""):
            open(started, "w").close()  # noqa: SIM115 - an empty file: the signal
        while not (until and os.path.exists(until)):
            time.sleep(0.05)
