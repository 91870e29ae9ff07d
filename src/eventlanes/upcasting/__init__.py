"""Upcasting at read time: stored events of an old shape read in the current one.

* ``naming.py``: how a type names its schema version (``"OrderPlaced"`` is version 1,
  ``"OrderPlaced.v2"`` version 2) and why the version is in the type;
* ``registry.py``: registering upcasters (``app.upcaster(...)``) and everything checked there,
  and turning events into their current shape (what the local runners, dead-letter retries
  and admin reads apply);
* ``arrow.py``: the same for events held as Arrow columns (the Spark readers, the PostgreSQL
  Arrow fold).

Every executor applies the upcasters before any handler, policy or key function sees an
event. Stored events are never rewritten: ``app.store`` reads (and exports) give what is
stored; ``app.upcast(events)`` gives the current shapes of events read that way.
"""

from __future__ import annotations

from .naming import split_type, type_name
from .registry import Upcaster, Upcasters

__all__ = ["Upcaster", "Upcasters", "split_type", "type_name"]
