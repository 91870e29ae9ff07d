"""Versions of a processor side by side (blue/green).

``app.processor("orders", version=2)`` declares a new version of processor ``orders``: a
processor of its own, stored as ``orders@v2`` (its tokens, dead letters and states) with its
own tables (``ctx.table("x")`` is ``{prefix}x__v2``), built from history while version 1 keeps
running and serving. The first node that starts it creates its token rows and, in the same
transaction, reads the tokens of the earlier versions: every event they had handled by then is
a replay for it (per part of their segments, mapped onto its own), so ``disallow_replay``
handlers stay silent there and run for everything after.

* ``view.py``: what ``status`` says of a version (which one serves, how far behind it is);
* ``lifecycle.py``: which version serves, ``promote`` (readers switch to a version that has
  caught up) and ``retire`` (an old version's tokens, states, dead letters and tables dropped,
  on request only).

Version 1 keeps the processor's name, tokens and tables: an app that never declares a version
stores exactly what it stored before.
"""

from __future__ import annotations

from .view import VersionView, serving_version

__all__ = ["VersionView", "serving_version"]
