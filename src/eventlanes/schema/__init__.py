"""The schema of eventlanes' tables: versioned, migrated explicitly or at open.

``eventlanes migrate URL`` (:func:`migrate`, ``App.migrate()``) creates or upgrades the tables
with a role that may; components only call :func:`require` when they open, which reads when
the schema is current (no DDL: an app can run as a role with SELECT, INSERT, UPDATE and DELETE
only). A store whose schema is missing or older is migrated at open when the role may
(SQLite; a PostgreSQL role that may create tables and owns the existing ones), and is a
:class:`~eventlanes.errors.SchemaError` naming the store, the versions and ``eventlanes migrate``
otherwise, before any DDL is tried.

* ``migrations.py``: the ordered migrations (one module each: ``v1_initial.py``...) and the
  objects of the current schema by part;
* ``history.py``: ``{prefix}schema_migrations``, the versions applied to a store;
* ``roles.py``: what the role may do (create, alter, read and write each object);
* ``migrator.py``: comparing versions, checking at open, applying under the schema lock.
"""

from __future__ import annotations

from .migrations import MIGRATIONS, Migration, latest
from .migrator import Migrated, SchemaState, inspect, migrate, require

__all__ = [
    "MIGRATIONS",
    "Migrated",
    "Migration",
    "SchemaState",
    "inspect",
    "latest",
    "migrate",
    "require",
]
