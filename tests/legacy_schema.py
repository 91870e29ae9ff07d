"""A store as the last release before schema versions left it: its components ran this DDL
when they opened (a frozen copy, run with the drivers directly, not through eventlanes), and
there is no ``schema_migrations`` table. Used to test that such stores are adopted."""

from __future__ import annotations

import sqlite3
import zlib
from urllib.parse import parse_qsl, urlsplit

SQLITE_EVENTS = [
    """CREATE TABLE IF NOT EXISTS {t}events (
        position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, version INTEGER NOT NULL,
        type TEXT NOT NULL, data TEXT NOT NULL, metadata TEXT NOT NULL,
        recorded_at INTEGER NOT NULL, routing_hash INTEGER NOT NULL,
        UNIQUE (stream_id, version))""",
    "CREATE INDEX IF NOT EXISTS {t}events_recorded_at ON {t}events (recorded_at)",
    "CREATE INDEX IF NOT EXISTS {t}events_type ON {t}events (type, position)",
]

POSTGRES_EVENTS = [
    "CREATE SEQUENCE IF NOT EXISTS {t}events_position_seq",
    """CREATE TABLE IF NOT EXISTS {t}events (
        position bigint PRIMARY KEY, stream_id text NOT NULL, version bigint NOT NULL,
        type text NOT NULL, data jsonb NOT NULL, metadata jsonb NOT NULL,
        recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        routing_hash bigint NOT NULL, UNIQUE (stream_id, version))""",
    "CREATE INDEX IF NOT EXISTS {t}events_recorded_at ON {t}events (recorded_at)",
    "CREATE INDEX IF NOT EXISTS {t}events_type ON {t}events (type, position)",
    """CREATE OR REPLACE FUNCTION {t}events_append(
            p_stream text, p_expected bigint, p_hash bigint,
            p_types text[], p_data jsonb[], p_meta jsonb[])
        RETURNS bigint[] LANGUAGE plpgsql AS $fn$
        DECLARE
            cur bigint;
            n int := cardinality(p_types);
            positions bigint[];
        BEGIN
            PERFORM pg_advisory_xact_lock({ns}, (p_hash - 2147483648)::int);
            SELECT coalesce(max(version), 0) INTO cur FROM {t}events WHERE stream_id = p_stream;
            IF p_expected IS NOT NULL AND cur <> p_expected THEN
                RAISE EXCEPTION USING ERRCODE = 'EL409', MESSAGE = cur::text;
            END IF;
            PERFORM pg_advisory_xact_lock_shared({marker_base} + (
                SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
                FROM {t}events_position_seq));
            SELECT array_agg(nextval('{t}events_position_seq') ORDER BY g) INTO positions
                FROM generate_series(1, n) AS g;
            INSERT INTO {t}events (position, stream_id, version, type, data, metadata,
                                   routing_hash)
                SELECT positions[i], p_stream, cur + i, p_types[i], p_data[i], p_meta[i], p_hash
                FROM generate_series(1, n) AS i;
            RETURN positions;
        END $fn$""",
    """CREATE OR REPLACE FUNCTION {t}events_horizon() RETURNS bigint
        LANGUAGE plpgsql VOLATILE AS $fn$
        DECLARE
            last_pos bigint;
            low_marker bigint;
        BEGIN
            SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO last_pos
                FROM {t}events_position_seq;
            SELECT min((l.classid::bigint << 32) | l.objid::bigint) INTO low_marker
                FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.objsubid = 1
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND (l.classid::bigint >> 16) = {ns};
            IF low_marker IS NULL THEN
                RETURN last_pos;
            END IF;
            RETURN least(last_pos, low_marker - {marker_base} - 1);
        END $fn$""",
]

SHARED = [
    """CREATE TABLE IF NOT EXISTS {t}tokens (
        processor TEXT NOT NULL, segment_id BIGINT NOT NULL, mask BIGINT NOT NULL,
        position BIGINT NOT NULL, token_detail TEXT, owner TEXT, claimed_since BIGINT,
        claim_deadline BIGINT, released_by TEXT, release_until BIGINT, request TEXT,
        refused TEXT, last_error TEXT, errors INTEGER NOT NULL DEFAULT 0, retry_at BIGINT,
        updated_at BIGINT NOT NULL, PRIMARY KEY (processor, segment_id))""",
    """CREATE TABLE IF NOT EXISTS {t}nodes (processor TEXT NOT NULL, node TEXT NOT NULL,
        last_seen BIGINT NOT NULL, PRIMARY KEY (processor, node))""",
    """CREATE TABLE IF NOT EXISTS {t}paused (processor TEXT NOT NULL PRIMARY KEY,
        paused_at BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {t}dead_letters (
        processor TEXT NOT NULL, position BIGINT NOT NULL, seq_key TEXT,
        routing_hash BIGINT NOT NULL, stream_id TEXT NOT NULL, version BIGINT NOT NULL,
        event_type TEXT NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1,
        parked_at BIGINT NOT NULL, PRIMARY KEY (processor, position))""",
    """CREATE TABLE IF NOT EXISTS {t}aggregates (
        aggregation TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        offsets TEXT NOT NULL, dropped BIGINT NOT NULL DEFAULT 0, updated_at BIGINT NOT NULL,
        PRIMARY KEY (aggregation, key))""",
    """CREATE TABLE IF NOT EXISTS {t}spark_batches (aggregation TEXT NOT NULL,
        batch_id BIGINT NOT NULL, end_position BIGINT NOT NULL,
        PRIMARY KEY (aggregation, batch_id))""",
]


def _prefix(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query)).get("prefix", "el_")


def create(url: str) -> None:
    """Create the old store's tables at ``url`` (SQLite or PostgreSQL, with its prefix), with
    two events of stream ``s`` (positions 1, 2) and processor ``p`` at position 1."""
    t = _prefix(url)
    ns = zlib.crc32(t.encode()) & 0x7FFF or 1
    if url.startswith("sqlite"):
        path = url.split("://", 1)[1][1:].split("?")[0]
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            for statement in SQLITE_EVENTS + SHARED:
                conn.execute(statement.format(t=t))
            conn.execute(
                f"INSERT INTO {t}events VALUES (1, 's', 1, 'A', '{{}}', '{{}}', 0, 1), "
                "(2, 's', 2, 'B', '{\"n\": 2}', '{}', 0, 1)"
            )
            conn.execute(f"INSERT INTO {t}tokens (processor, segment_id, mask, position, "
                         "updated_at) VALUES ('p', 0, 0, 1, 0)")  # fmt: skip
        finally:
            conn.close()
        return
    import psycopg

    libpq = url.split("?")[0]
    with psycopg.connect(libpq, autocommit=True) as conn:
        for statement in POSTGRES_EVENTS + SHARED:
            conn.execute(statement.format(t=t, ns=ns, marker_base=ns << 48))
        conn.execute(
            f"SELECT {t}events_append('s', 0, 1, ARRAY['A', 'B'], "
            """ARRAY['{}', '{"n": 2}']::jsonb[], ARRAY['{}', '{}']::jsonb[])"""
        )
        conn.execute(f"INSERT INTO {t}tokens (processor, segment_id, mask, position, "
                     "updated_at) VALUES ('p', 0, 0, 1, 0)")  # fmt: skip
