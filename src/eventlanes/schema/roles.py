"""What the database role may do with the schema, asked before anything is tried.

On PostgreSQL an app commonly runs as a role with only SELECT, INSERT, UPDATE and DELETE on
tables another role owns. Such a role must never attempt DDL (the server would refuse it with
a raw error) and must learn at open, in one line, which privilege it lacks. SQLite has no
roles: whoever may write the file may change its schema.
"""

from __future__ import annotations

from ..db import Database
from .history import NAME
from .migrations import LEGACY_TABLES, PARTS

_FUNCTIONS = ("events_append", "events_horizon")


def cannot_migrate(db: Database, tables: list[str]) -> str | None:
    """Why this role may not create or change the schema (None: it may). ``tables``: our
    relations that exist; altering them (or replacing our functions) needs their owner."""
    if db.backend != "postgresql":
        return None
    relations = [*tables, db.table("events_position_seq")]
    user, schema, may_create, foreign_relations, foreign_functions = db.query(
        """SELECT current_user::text, current_schema()::text,
                  coalesce(has_schema_privilege(current_schema(), 'CREATE'), false),
                  ARRAY(SELECT c.relname::text FROM pg_class c
                        WHERE c.oid IN (SELECT to_regclass(n) FROM unnest(%s::text[]) AS n)
                          AND NOT pg_has_role(c.relowner, 'USAGE') ORDER BY 1),
                  ARRAY(SELECT p.proname::text FROM pg_proc p
                        WHERE p.proname = ANY(%s::text[]) AND pg_function_is_visible(p.oid)
                          AND NOT pg_has_role(p.proowner, 'USAGE') ORDER BY 1)""",
        (relations, [db.table(f) for f in _FUNCTIONS]),
    )[0]
    if schema is None:
        return f"role {user!r} has no schema to create tables in (its search_path is empty)"
    if not may_create:
        return f"role {user!r} may not create tables in schema {schema!r}"
    foreign = [*foreign_relations, *foreign_functions]
    if foreign:
        return f"role {user!r} does not own {', '.join(foreign)} (only their owner may alter them)"
    return None


def existing_tables(db: Database) -> dict[str, bool]:
    """Our tables that exist (the migrations table and those of the releases before it), and
    whether this role may read each (always True on SQLite)."""
    names = [db.table(n) for n in (NAME, *LEGACY_TABLES)]
    if db.backend == "postgresql":
        rows = db.query(
            "SELECT n, has_table_privilege(to_regclass(n), 'SELECT') "
            "FROM unnest(%s::text[]) AS n WHERE to_regclass(n) IS NOT NULL",
            (names,),
        )
        return {name: bool(readable) for name, readable in rows}
    return dict.fromkeys(_sqlite_tables(db, names), True)


def missing(db: Database, part: str) -> tuple[list[str], list[str], str]:
    """For one part of the schema: the objects that do not exist, the privileges this role
    lacks on the others (``"INSERT on el_tokens"``), and the role's name."""
    objects = [
        (kind, db.table(name), write if db.create else read)
        for kind, name, write, read in PARTS[part]
        if kind == "table" or db.backend == "postgresql"
    ]
    if db.backend != "postgresql":
        present = _sqlite_tables(db, [name for _, name, _ in objects])
        return [name for _, name, _ in objects if name not in present], [], ""
    rows = db.query(
        """SELECT o.name, o.kind, o.priv, to_regclass(o.name) IS NOT NULL,
                  CASE WHEN to_regclass(o.name) IS NULL THEN false
                       WHEN o.kind = 'table' THEN has_table_privilege(to_regclass(o.name), o.priv)
                       ELSE has_sequence_privilege(to_regclass(o.name), o.priv) END,
                  current_user::text
           FROM unnest(%s::text[], %s::text[], %s::text[]) AS o(name, kind, priv)""",
        (
            [name for _, name, privs in objects for _ in privs],
            [kind for kind, _, privs in objects for _ in privs],
            [p for _, _, privs in objects for p in privs],
        ),
    )
    absent = sorted({name for name, _, _, exists, _, _ in rows if not exists})
    lacking = [f"{priv} on {name}" for name, _, priv, exists, ok, _ in rows if exists and not ok]
    return absent, lacking, rows[0][5] if rows else ""


def tables_present(db: Database, names: list[str]) -> list[str]:
    """The tables of ``names`` that exist, in the order given."""
    if not names:
        return []
    if db.backend == "postgresql":
        rows = db.query("SELECT n FROM unnest(%s::text[]) AS n WHERE to_regclass(n) IS NOT NULL",
                        (names,))  # fmt: skip
        present = {r[0] for r in rows}
    else:
        present = _sqlite_tables(db, names)
    return [n for n in names if n in present]


def cannot_drop(db: Database, tables: list[str]) -> str | None:
    """Why this role may not drop ``tables`` (None: it may). Dropping a table needs its owner
    on PostgreSQL; a role with DML only may not (SQLite: whoever may write the file may)."""
    if db.backend != "postgresql" or not tables:
        return None
    user, foreign = db.query(
        """SELECT current_user::text,
                  ARRAY(SELECT c.relname::text FROM pg_class c
                        WHERE c.oid IN (SELECT to_regclass(n) FROM unnest(%s::text[]) AS n)
                          AND NOT pg_has_role(c.relowner, 'USAGE') ORDER BY 1)""",
        (tables,),
    )[0]
    if foreign:
        return f"role {user!r} may not drop {', '.join(foreign)} (only their owner may)"
    return None


def _sqlite_tables(db: Database, names: list[str]) -> set[str]:
    marks = ", ".join("?" for _ in names)
    sql = f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({marks})"
    return {name for (name,) in db.query(sql, names)}
