"""Lakehouse tables at the edges: an aggregation's states written as a Delta Lake table, its
position kept in the table's own commits (:mod:`.delta`).

Needs the ``delta`` extra (deltalake); nothing here imports it until a table is written.
"""

from .delta import DeltaStates

__all__ = ["DeltaStates"]
