"""The ``eventlanes`` command line: run, inspect and steer processors.

``base`` holds the click group (``main``) and what the commands share; each command module
registers its commands on it when imported here:

* ``run``: run (local, ``--processes``, ``--engine spark``);
* ``status``: info, migrate, status;
* ``steer``: split, merge, release, pause, resume, balance, reset, dead-letters;
* ``versions``: promote, retire;
* ``spark``: replay, export;
* ``dashboard``: dashboard.

``supervisor`` runs the worker processes of ``run --processes``; ``logs`` sets up log lines;
``entry`` is the command's first moments (its signal handling, then the command line).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import main

__all__ = ["main"]

#: the modules whose commands register on ``main`` when imported
COMMANDS = ("dashboard", "run", "spark", "status", "steer", "versions")


def __getattr__(name: str) -> Any:
    # Loaded on first use: a worker of ``run --processes`` imports this package (its entry
    # is ``supervisor``) and must reach its signal handling before click and the commands.
    if name == "main":
        for module in COMMANDS:
            importlib.import_module(f".{module}", __name__)
        from .base import main

        globals()["main"] = main
        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
