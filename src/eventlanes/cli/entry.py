"""The ``eventlanes`` command's first moments.

Loading the command line takes about a second (click, rich, the whole library). A SIGINT
or SIGTERM in that second used to end it with a KeyboardInterrupt traceback from inside an
import. Here the signal handling comes first, before anything heavy is imported: a stop
while loading ends at once and quietly, ``run`` with exit 0 (as once it loads: an
orchestrator may stop a worker while it starts), any other command with 128 + the signal,
so a script never takes an interrupted ``migrate`` for a done one.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

from .. import signals


def main() -> None:
    signals.interrupt_startup()
    try:
        from . import main as cli

        lost = signals.stopped_while_starting()  # its exception discarded by Python
        if lost is not None:
            _stopped(lost)
        if _command(sys.argv[1:]) != "run":  # ``run`` keeps them until its processors run
            signals.startup_done()  # other commands: a Ctrl-C as before (click's "Aborted!")
        cli()
    except signals.StartupInterrupted as exc:  # also ``run`` while click parses its options
        _stopped(str(exc))


def _stopped(name: str) -> NoReturn:
    if _command(sys.argv[1:]) == "run":
        sys.stderr.write(f"stopped by {name} while starting\n")
        sys.exit(0)
    sys.stderr.write(f"error: stopped by {name} while starting\n")
    sys.exit(128 + signal.Signals[name].value)


#: the group's options that take a value (``eventlanes --log-format json run ...``)
_VALUED = ("--log-level", "--log-format")


def _command(args: list[str]) -> str | None:
    """The command named by the arguments, past the group's own options."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None
