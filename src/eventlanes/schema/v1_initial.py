"""Schema version 1: every table of the first releases, as their components created them at
open (before schema versions existed).

Written so that it also adopts a store those releases created: every statement is idempotent
(``IF NOT EXISTS``, ``CREATE OR REPLACE``), and a token table of the oldest releases gains its
``refused`` column. Never change this module once released: a later change of the schema is a
migration of its own (see :mod:`eventlanes.schema.migrations`).
"""

from __future__ import annotations

from typing import Any

from ..db import Database

#: SQLSTATE the PostgreSQL append function raises on a version conflict (message: the
#: stream's actual version).
VERSION_CONFLICT = "EL409"
#: In-flight position markers are single-bigint advisory keys (namespace << 48) | position.
MARKER_SHIFT = 48


def apply(db: Database, conn: Any) -> None:
    for statement in _postgres_events(db) if db.backend == "postgresql" else _sqlite_events(db):
        conn.execute(statement)
    for statement in _shared(db):
        conn.execute(statement)
    # The oldest releases' token table has no ``refused`` column (SQLite cannot say IF NOT
    # EXISTS here; the caller's lock keeps the look and the change together).
    tokens = db.table("tokens")
    if db.backend == "postgresql":
        conn.execute(f"ALTER TABLE {tokens} ADD COLUMN IF NOT EXISTS refused TEXT")
    elif "refused" not in {row[1] for row in conn.execute(f"PRAGMA table_info({tokens})")}:
        conn.execute(f"ALTER TABLE {tokens} ADD COLUMN refused TEXT")


def _sqlite_events(db: Database) -> list[str]:
    t = db.table("events")
    return [
        f"""CREATE TABLE IF NOT EXISTS {t} (
            position INTEGER PRIMARY KEY,
            stream_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            metadata TEXT NOT NULL,
            recorded_at INTEGER NOT NULL,
            routing_hash INTEGER NOT NULL,
            UNIQUE (stream_id, version))""",
        f"CREATE INDEX IF NOT EXISTS {t}_recorded_at ON {t} (recorded_at)",
        # Type filters: the rows of one type in position order.
        f"CREATE INDEX IF NOT EXISTS {t}_type ON {t} (type, position)",
    ]


def _postgres_events(db: Database) -> list[str]:
    """The events table, its position sequence, and the append and horizon functions (see
    :mod:`eventlanes.store.postgres` for why they are safe)."""
    t = db.table("events")
    ns = db.lock_namespace  # type: ignore[attr-defined]
    marker_base = ns << MARKER_SHIFT
    seq = f"{t}_position_seq"
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {seq}",
        f"""CREATE TABLE IF NOT EXISTS {t} (
            position bigint PRIMARY KEY,
            stream_id text NOT NULL,
            version bigint NOT NULL,
            type text NOT NULL,
            data jsonb NOT NULL,
            metadata jsonb NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            routing_hash bigint NOT NULL,
            UNIQUE (stream_id, version))""",
        f"CREATE INDEX IF NOT EXISTS {t}_recorded_at ON {t} (recorded_at)",
        # Type filters: the rows of one type in position order.
        f"CREATE INDEX IF NOT EXISTS {t}_type ON {t} (type, position)",
        f"""CREATE OR REPLACE FUNCTION {t}_append(
                p_stream text, p_expected bigint, p_hash bigint,
                p_types text[], p_data jsonb[], p_meta jsonb[])
            RETURNS bigint[] LANGUAGE plpgsql AS $fn$
            DECLARE
                cur bigint;
                n int := cardinality(p_types);
                positions bigint[];
            BEGIN
                -- one appender per stream at a time, until commit
                PERFORM pg_advisory_xact_lock({ns}, (p_hash - 2147483648)::int);
                SELECT coalesce(max(version), 0) INTO cur
                    FROM {t} WHERE stream_id = p_stream;
                IF p_expected IS NOT NULL AND cur <> p_expected THEN
                    RAISE EXCEPTION USING ERRCODE = '{VERSION_CONFLICT}',
                        MESSAGE = cur::text;
                END IF;
                -- in-flight marker: a lower bound of the positions allocated next
                PERFORM pg_advisory_xact_lock_shared({marker_base} + (
                    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
                    FROM {seq}));
                SELECT array_agg(nextval('{seq}') ORDER BY g) INTO positions
                    FROM generate_series(1, n) AS g;
                INSERT INTO {t} (position, stream_id, version, type, data, metadata,
                                 routing_hash)
                    SELECT positions[i], p_stream, cur + i, p_types[i], p_data[i],
                           p_meta[i], p_hash
                    FROM generate_series(1, n) AS i;
                RETURN positions;
            END $fn$""",
        f"""CREATE OR REPLACE FUNCTION {t}_horizon() RETURNS bigint
            LANGUAGE plpgsql VOLATILE AS $fn$
            DECLARE
                last_pos bigint;
                low_marker bigint;
            BEGIN
                -- order matters: the sequence first, then the markers
                SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO last_pos
                    FROM {seq};
                SELECT min((l.classid::bigint << 32) | l.objid::bigint) INTO low_marker
                    FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.objsubid = 1
                      AND l.database = (SELECT oid FROM pg_database
                                        WHERE datname = current_database())
                      AND (l.classid::bigint >> 16) = {ns};
                IF low_marker IS NULL THEN
                    RETURN last_pos;
                END IF;
                RETURN least(last_pos, low_marker - {marker_base} - 1);
            END $fn$""",
    ]


def _shared(db: Database) -> list[str]:
    """Tables written the same way on both backends: tokens (with nodes and paused processors),
    dead letters, aggregation states, the continuous Spark runner's batches."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {db.table("tokens")} (
            processor TEXT NOT NULL,
            segment_id BIGINT NOT NULL,
            mask BIGINT NOT NULL,
            position BIGINT NOT NULL,
            token_detail TEXT,
            owner TEXT,
            claimed_since BIGINT,
            claim_deadline BIGINT,
            released_by TEXT,
            release_until BIGINT,
            request TEXT,
            refused TEXT,
            last_error TEXT,
            errors INTEGER NOT NULL DEFAULT 0,
            retry_at BIGINT,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (processor, segment_id))""",
        f"""CREATE TABLE IF NOT EXISTS {db.table("nodes")} (
            processor TEXT NOT NULL,
            node TEXT NOT NULL,
            last_seen BIGINT NOT NULL,
            PRIMARY KEY (processor, node))""",
        f"""CREATE TABLE IF NOT EXISTS {db.table("paused")} (
            processor TEXT NOT NULL PRIMARY KEY,
            paused_at BIGINT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {db.table("dead_letters")} (
            processor TEXT NOT NULL,
            position BIGINT NOT NULL,
            seq_key TEXT,
            routing_hash BIGINT NOT NULL,
            stream_id TEXT NOT NULL,
            version BIGINT NOT NULL,
            event_type TEXT NOT NULL,
            error TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 1,
            parked_at BIGINT NOT NULL,
            PRIMARY KEY (processor, position))""",
        f"""CREATE TABLE IF NOT EXISTS {db.table("aggregates")} (
            aggregation TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            offsets TEXT NOT NULL,
            dropped BIGINT NOT NULL DEFAULT 0,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (aggregation, key))""",
        f"""CREATE TABLE IF NOT EXISTS {db.table("spark_batches")} (
            aggregation TEXT NOT NULL,
            batch_id BIGINT NOT NULL,
            end_position BIGINT NOT NULL,
            PRIMARY KEY (aggregation, batch_id))""",
    ]
