"""The ``eventlanes`` command line: run, inspect and steer processors.

``base`` holds the click group (``main``) and what the commands share; each command module
registers its commands on it when imported here:

* ``run``: run (local, ``--processes``, ``--engine spark``);
* ``status``: info, migrate, status;
* ``steer``: split, merge, release, pause, resume, balance, reset, dead-letters;
* ``versions``: promote, retire;
* ``spark``: replay, export;
* ``dashboard``: dashboard.

``supervisor`` runs the worker processes of ``run --processes``; ``logs`` sets up log lines.
"""

from __future__ import annotations

# imported for their commands, which register on main
from . import dashboard, run, spark, status, steer, versions  # noqa: F401
from .base import main

__all__ = ["main"]
