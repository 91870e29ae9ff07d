"""Checking a store's schema when a component opens it, and migrating it.

Versions are compared as sets: the store is current when every migration of the code is in its
``schema_migrations`` table and the table holds no version the code does not know. Changes
run in one transaction under the schema lock (PostgreSQL: an advisory lock; SQLite: its write
lock, ``BEGIN IMMEDIATE``), which re-reads the applied versions first: many processes opening
or migrating at once apply each migration exactly once, and a failed migration leaves the
schema as it was (DDL is transactional on both backends).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..db import Database, open_database
from ..errors import SchemaError
from . import history, migrations, roles
from .migrations import Migration

log = logging.getLogger("eventlanes.schema")

_VERSION = "version"  # in Database.schema_checked: the version check passed


@dataclass(frozen=True)
class SchemaState:
    """What a store holds: ``applied`` versions (None: no migrations table) and which of
    eventlanes' tables exist (and whether the role may read each)."""

    url: str  # password hidden
    applied: dict[int, str] | None
    tables: dict[str, bool] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return max(self.applied, default=0) if self.applied else 0

    @property
    def pending(self) -> list[Migration]:
        done = self.applied or {}
        return [m for m in migrations.MIGRATIONS if m.version not in done]

    @property
    def unknown(self) -> list[int]:
        known = {m.version for m in migrations.MIGRATIONS}
        return sorted(set(self.applied or ()) - known)

    @property
    def legacy(self) -> bool:
        """Tables of a release from before schema versions, without the migrations table."""
        return self.applied is None and bool(self.tables)

    @property
    def current(self) -> bool:
        return not self.pending and not self.unknown

    def describe(self) -> str:
        if self.legacy:
            return "tables of an eventlanes release from before schema versions"
        if self.applied is None:
            return "no eventlanes tables"
        return f"schema version {self.version}"


@dataclass(frozen=True)
class Migrated:
    """What :func:`migrate` found and did."""

    before: SchemaState
    applied: tuple[Migration, ...]

    @property
    def version(self) -> int:
        return self.applied[-1].version if self.applied else self.before.version

    def summary(self) -> str:
        url = self.before.url
        if not self.applied:
            return f"{url}: schema version {self.version}, up to date (nothing to do)"
        done = ", ".join(f"{m.version} {m.name}" for m in self.applied)
        return f"{url}: {self.before.describe()} -> schema version {self.version} (applied {done})"


def inspect(db: Database) -> SchemaState:
    """The store's schema state; reads only."""
    url = db.url.redacted
    with db.guard(f"check the schema of store {url!r}"):
        tables = roles.existing_tables(db)
        name = db.table(history.NAME)
        if name not in tables:
            return SchemaState(url, None, tables)
        if not tables[name]:
            user = db.query("SELECT current_user::text")[0][0]
            raise SchemaError(
                f"role {user!r} may not read {name} of store {url!r}: grant SELECT on it (and "
                "SELECT, INSERT, UPDATE, DELETE on eventlanes' other tables; README: "
                "Production roles)"
            )
        with db.connection() as conn:
            applied = history.applied(db, conn)
    return SchemaState(url, applied, {t: ok for t, ok in tables.items() if t != name})


def require(db: Database, part: str) -> None:
    """Make sure the part of the schema a component uses (a key of ``PARTS``) is there and
    usable by this role, once per open database. When the store's schema is missing or older
    than the code: a writable open migrates it if the role may (SQLite; a PostgreSQL role that
    may create tables and owns the existing ones), and raises :class:`SchemaError` otherwise
    without trying any DDL. When current: only reads."""
    if part in db.schema_checked:
        return
    if _VERSION not in db.schema_checked:
        _check_version(db)
        db.schema_checked.add(_VERSION)
    url = db.url.redacted
    with db.guard(f"check the schema of store {url!r}"):
        absent, lacking, user = roles.missing(db, part)
    if absent:
        if not db.create:
            raise SchemaError(
                f"store {url!r} (opened with create=False) has no table {absent[0]!r}: not an "
                "eventlanes store, another table prefix, or not initialised yet (`eventlanes "
                "migrate URL` creates it)"
            )
        raise SchemaError(
            f"store {url!r} records schema version {migrations.latest()} but has no "
            f"{', '.join(absent)}: dropped by hand? restore it from a backup"
        )
    if lacking:
        raise SchemaError(
            f"role {user!r} lacks privileges on store {url!r}: {', '.join(lacking)}. Grant "
            "SELECT, INSERT, UPDATE, DELETE on eventlanes' tables and USAGE, SELECT on its "
            "sequence (README: Production roles)"
            + ("" if db.create else "; a read-only open (create=False) needs SELECT only")
        )
    db.schema_checked.add(part)


def _check_version(db: Database) -> None:
    state = inspect(db)
    if state.current:
        return
    if state.unknown:
        raise _newer(state)
    url = state.url
    if not db.create:
        if state.applied is None:
            return  # nothing to compare: each part checks that its tables exist
        raise SchemaError(
            f"store {url!r} has {state.describe()}, {_needs(state)}: run `eventlanes migrate "
            f"{url}` (this open is read-only: create=False)"
        )
    with db.guard(f"check the schema of store {url!r}"):
        reason = roles.cannot_migrate(db, list(state.tables))
    if reason is not None:
        raise SchemaError(
            f"store {url!r} has {state.describe()}, {_needs(state)}, and {reason}: run "
            f"`eventlanes migrate {url}` (or App.migrate()) once with a role that may create "
            "and alter its tables"
        )
    _apply(db, state)


def migrate(target: str | Database) -> Migrated:
    """Create the store's tables, adopt those of a release from before schema versions, or
    apply the migrations it lacks; nothing when current. ``target``: a store URL or an open
    :class:`Database`. Raises :class:`SchemaError` when the role may not change the schema
    (nothing is tried) or the store's schema is newer than this eventlanes."""
    db = open_database(target) if isinstance(target, str) else target
    try:
        if not db.create:
            raise SchemaError(f"cannot migrate store {db.url.redacted!r}: opened read-only")
        before = inspect(db)
        if before.unknown:
            raise _newer(before)
        if before.current:
            return Migrated(before, ())
        with db.guard(f"check the schema of store {before.url!r}"):
            reason = roles.cannot_migrate(db, list(before.tables))
        if reason is not None:
            raise SchemaError(
                f"cannot migrate store {before.url!r} (it has {before.describe()}, "
                f"{_needs(before)}): {reason}; run it with a role that may create tables and "
                "owns eventlanes' tables"
            )
        return Migrated(before, _apply(db, before))
    finally:
        if db is not target:
            db.close()


def _apply(db: Database, state: SchemaState) -> tuple[Migration, ...]:
    url = state.url
    with db.guard(f"migrate the schema of store {url!r}"), db.ddl_transaction() as conn:
        history.create(db, conn)
        done = history.applied(db, conn)  # again, under the lock: another process may have
        if set(done) - {m.version for m in migrations.MIGRATIONS}:
            raise _newer(SchemaState(url, done))
        todo = tuple(m for m in migrations.MIGRATIONS if m.version not in done)
        for migration in todo:
            migration.apply(db, conn)
            history.record(db, conn, migration)
    for migration in todo:
        log.info("store %s: applied schema migration %d (%s)", url, migration.version,
                 migration.name)  # fmt: skip
    return todo


def _needs(state: SchemaState) -> str:
    pending = ", ".join(f"{m.version} {m.name}" for m in state.pending)
    return f"this eventlanes needs schema version {migrations.latest()} (pending: {pending})"


def _newer(state: SchemaState) -> SchemaError:
    return SchemaError(
        f"store {state.url!r} has schema version {state.version}, newer than this "
        f"eventlanes (it knows versions up to {migrations.latest()}): run the eventlanes "
        "release that migrated it, or a later one"
    )
