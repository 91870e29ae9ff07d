"""Token store on SQLite or PostgreSQL, by default in the event store's own database so that
projections commit together with their token.

Table ``{prefix}tokens``, one row per (processor, segment):

| column | meaning |
|---|---|
| processor, segment_id | primary key |
| mask | the segment's mask (stored, never inferred from the set of ids) |
| position | the token: every event of the segment at or below it is done |
| token_detail | JSON for merged tokens (positions of halves that were ahead), else NULL |
| owner, claimed_since, claim_deadline | the claim; times are epoch ms on the database's clock |
| released_by, release_until | a released claim its last owner will not take back before then |
| last_error, errors, retry_at | the last processing error, consecutive failures, and when the
  segment may be claimed again (back-off) |
| updated_at | when the token was last written |

| request | a split or merge asked for by another node, for the owner to carry out |
| refused | why the owner refused the last request (cleared by the next request) |

Table ``{prefix}nodes``: (processor, node, last_seen) heartbeats, for fair shares and status.

Table ``{prefix}paused``: one row per paused processor (processor, paused_at). A table of its
own, so that a processor can be paused before its token rows exist.

Table ``{prefix}versions``: one row per version of a processor that was started, promoted or
retired (processor, base, version, started_at, promoted_at, retired_at); see
:mod:`eventlanes.admin.versions`. A retired processor keeps one token row, owned by ``(retired)``
with a claim that never expires, so no node of any release runs it again.

The tables are part of eventlanes' versioned schema (:mod:`eventlanes.schema`): opening a
current schema only reads, so read-only work (``status``) never writes.
"""

from __future__ import annotations

from typing import Any

from ..db import Database
from ..errors import ClaimLostError, CorruptTokenError
from ..names import split_version
from ..schema import require
from ..segments import Segment
from .base import (
    DEFAULT_CLAIM_TIMEOUT,
    RETIRED,
    RETIRED_NOTE,
    SegmentStatus,
    TokenRecord,
    TokenStore,
    VersionRecord,
    backoff,
    merge_rows,
    paused_error,
    retire_checked,
    split_checked,
    succeeding_tokens,
)
from .token import Token

#: the claim deadline of a retired processor's marker row (epoch ms): never reached
NEVER_MS = 2**62


class SQLTokenStore(TokenStore):
    def __init__(self, db: Database, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> None:
        super().__init__(claim_timeout)
        self.db = db
        self.table = t = db.table("tokens")
        self.nodes_table = db.table("nodes")
        self.paused_table = pz = db.table("paused")
        self.versions_table = db.table("versions")
        require(db, "tokens")  # the tables: eventlanes.schema.v1_initial, v2_versions
        now = db.now_ms
        q = db.sql
        not_paused = f"NOT EXISTS (SELECT 1 FROM {pz} WHERE processor = ?)"
        self._claim_sql = q(
            f"""UPDATE {t} SET owner = ?, claim_deadline = {now} + ?,
                    claimed_since = CASE WHEN owner = ? THEN claimed_since ELSE {now} END
                WHERE processor = ? AND segment_id = ?
                  AND (owner IS NULL OR owner = ? OR claim_deadline < {now})
                  AND NOT (coalesce(released_by, '') = ? AND coalesce(release_until, 0) > {now})
                  AND (? OR coalesce(retry_at, 0) <= {now})
                  AND (? OR {not_paused})
                RETURNING mask, position, token_detail"""
        )
        self._extend_sql = q(
            f"UPDATE {t} SET claim_deadline = {now} + ? "
            f"WHERE processor = ? AND segment_id = ? AND owner = ? AND {not_paused}"
        )
        self._extend_all_sql = q(
            f"UPDATE {t} SET claim_deadline = {now} + ? WHERE processor = ? AND owner = ? "
            f"AND {not_paused} RETURNING segment_id"
        )
        self._release_sql = q(
            f"""UPDATE {t} SET owner = NULL, claim_deadline = NULL, claimed_since = NULL,
                    released_by = ?, release_until = {now} + ?
                WHERE processor = ? AND segment_id = ? AND owner = ?"""
        )
        self._store_sql = q(
            f"""UPDATE {t} SET position = ?, token_detail = ?, claim_deadline = {now} + ?,
                    updated_at = {now}, last_error = NULL, errors = 0, retry_at = NULL
                WHERE processor = ? AND segment_id = ? AND owner = ?"""
        )
        self._owner_sql = q(f"SELECT owner FROM {t} WHERE processor = ? AND segment_id = ?")
        self._rows_sql = q(
            f"SELECT segment_id, mask, position, token_detail, owner FROM {t} "
            f"WHERE processor = ? ORDER BY segment_id{db.for_update}"
        )
        self._status_sql = q(
            f"""SELECT segment_id, mask, position, token_detail, owner, claimed_since,
                    claim_deadline, request, last_error, updated_at, errors, retry_at, {now},
                    refused, (SELECT count(*) FROM {pz} WHERE processor = ?)
                FROM {t} WHERE processor = ? ORDER BY segment_id"""
        )
        self._is_paused_sql = q(f"SELECT count(*) FROM {pz} WHERE processor = ?")

    def _write(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        # A single statement is its own transaction: autocommit on both backends.
        with self.db.connection() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else [(cur.rowcount,)]

    def _initialize(self, processor: str, segments: list[Segment], position: int) -> bool:
        t = self.table
        with self.db.transaction() as conn:
            self.db.lock(conn, f"init:{processor}")
            exists = conn.execute(
                self.db.sql(f"SELECT 1 FROM {t} WHERE processor = ? LIMIT 1"), (processor,)
            ).fetchone()
            if exists:
                return False
            insert = self.db.sql(
                f"INSERT INTO {t} (processor, segment_id, mask, position, updated_at) "
                f"VALUES (?, ?, ?, ?, {self.db.now_ms})"
            )
            for seg in segments:
                conn.execute(insert, (processor, seg.id, seg.mask, position))
            return True

    def _add_segments(self, processor: str, rows: list[tuple[Segment, int]]) -> list[Segment]:
        insert = self.db.sql(
            f"INSERT INTO {self.table} (processor, segment_id, mask, position, updated_at) "
            f"VALUES (?, ?, ?, ?, {self.db.now_ms}) "
            "ON CONFLICT (processor, segment_id) DO NOTHING"
        )
        created = []
        with self.db.transaction() as conn:
            for segment, position in rows:
                cur = conn.execute(insert, (processor, segment.id, segment.mask, position))
                if cur.rowcount == 1:
                    created.append(segment)
        return created

    def _initialize_after(
        self,
        processor: str,
        segments: list[Segment],
        position: int,
        after: list[str],
        per_part: bool,
        context: Any,
    ) -> bool:
        t, q, now = self.table, self.db.sql, self.db.now_ms
        base, version = split_version(processor)
        with self.db.transaction() as conn:
            self.db.lock(conn, f"init:{processor}")
            exists = conn.execute(
                q(f"SELECT 1 FROM {t} WHERE processor = ? LIMIT 1"), (processor,)
            ).fetchone()
            if exists:
                return False
            rows = []
            if after:  # one statement: one snapshot of every predecessor's segments
                marks = ", ".join("?" for _ in after)
                found = conn.execute(
                    q(
                        f"SELECT processor, segment_id, mask, position, token_detail, owner "
                        f"FROM {t} WHERE processor IN ({marks})"
                    ),
                    tuple(after),
                ).fetchall()
                rows = [(n, Segment(i, m), Token.decode(n, Segment(i, m), p, d), o)
                        for n, i, m, p, d, o in found]  # fmt: skip
            tokens = succeeding_tokens(processor, segments, position, rows, per_part, context)
            insert = q(
                f"INSERT INTO {t} (processor, segment_id, mask, position, token_detail, "
                f"updated_at) VALUES (?, ?, ?, ?, ?, {now})"
            )
            for seg, tok in zip(segments, tokens, strict=True):
                conn.execute(insert, (processor, seg.id, seg.mask, tok.position, tok.detail()))
            if version > 1:
                conn.execute(
                    q(
                        f"INSERT INTO {self.versions_table} (processor, base, version, "
                        f"started_at) VALUES (?, ?, ?, {now}) ON CONFLICT (processor) "
                        "DO UPDATE SET started_at = excluded.started_at"
                    ),
                    (processor, base, version),
                )
            return True

    def _versions(self, base: str) -> list[VersionRecord]:
        rows = self.db.query(
            self.db.sql(
                f"SELECT processor, base, version, started_at, promoted_at, retired_at "
                f"FROM {self.versions_table} WHERE base = ? ORDER BY version"
            ),
            (base,),
        )
        return [
            VersionRecord(p, b, v, *(None if t is None else t / 1000 for t in times))
            for p, b, v, *times in rows
        ]

    def _promote(self, processor: str) -> None:
        base, version = split_version(processor)
        v, q = self.versions_table, self.db.sql
        later = "greatest" if self.db.backend == "postgresql" else "max"
        with self.db.transaction() as conn:
            # The last promotion serves: times strictly increase per processor, also for two
            # promotions within one millisecond (or of a clock that went back).
            self.db.lock(conn, f"promote:{base}")
            conn.execute(
                q(
                    f"""INSERT INTO {v} (processor, base, version, promoted_at)
                        VALUES (?, ?, ?, (SELECT {later}({self.db.now_ms},
                                coalesce(max(promoted_at), 0) + 1) FROM {v} WHERE base = ?))
                        ON CONFLICT (processor) DO UPDATE SET promoted_at = excluded.promoted_at"""
                ),
                (processor, base, version, base),
            )

    def _retire(self, processor: str, owner: str, conn: Any) -> int:
        if conn is None:
            with self.db.transaction() as own:
                return self._retire_in(own, processor, owner)
        return self._retire_in(conn, processor, owner)

    def _retire_in(self, conn: Any, processor: str, owner: str) -> int:
        t, q, now = self.table, self.db.sql, self.db.now_ms
        rows = [
            (Segment(i, m), Token.decode(processor, Segment(i, m), p, d), o)
            for i, m, p, d, o in conn.execute(self._rows_sql, (processor,)).fetchall()
        ]
        position = retire_checked(processor, rows, owner)
        conn.execute(q(f"DELETE FROM {t} WHERE processor = ?"), (processor,))
        conn.execute(
            q(
                f"""INSERT INTO {t} (processor, segment_id, mask, position, owner, claimed_since,
                        claim_deadline, last_error, updated_at)
                    VALUES (?, 0, 0, ?, ?, {now}, ?, ?, {now})"""
            ),
            (processor, position, RETIRED, NEVER_MS, RETIRED_NOTE),
        )
        for table in (self.nodes_table, self.paused_table):
            conn.execute(q(f"DELETE FROM {table} WHERE processor = ?"), (processor,))
        base, version = split_version(processor)
        conn.execute(
            q(
                f"INSERT INTO {self.versions_table} (processor, base, version, retired_at) "
                f"VALUES (?, ?, ?, {now}) ON CONFLICT (processor) "
                "DO UPDATE SET retired_at = excluded.retired_at"
            ),
            (processor, base, version),
        )
        return len(rows)

    def _claim(
        self, processor: str, segment_id: int, owner: str, ignore_backoff: bool, ignore_pause: bool
    ) -> TokenRecord | None:
        params = (owner, self.timeout_ms, owner, processor, segment_id, owner, owner,
                  ignore_backoff, ignore_pause, processor)  # fmt: skip
        rows = self._write(self._claim_sql, params)
        if not rows:
            return None
        mask, position, detail = rows[0]
        segment = Segment(segment_id, mask)
        try:
            token = Token.decode(processor, segment, position, detail)
        except CorruptTokenError as exc:
            # Claimed a moment ago: let it go as a failed attempt (back-off, the error shown on
            # the segment), so no runner starts from a guess and the stored row stays as it is.
            self._fail(processor, segment_id, owner, str(exc))
            raise
        return TokenRecord(processor, segment, token, owner)

    def _extend(self, processor: str, segment_id: int, owner: str) -> None:
        params = (self.timeout_ms, processor, segment_id, owner, processor)
        [(count,)] = self._write(self._extend_sql, params)
        if count != 1:
            if self._is_paused(processor) and self.db.query(
                self._owner_sql, (processor, segment_id)
            ) == [(owner,)]:
                raise paused_error(processor)
            self._lost(None, processor, segment_id, owner)

    def _extend_all(self, processor: str, owner: str) -> list[int]:
        rows = self._write(self._extend_all_sql, (self.timeout_ms, processor, owner, processor))
        return sorted(r[0] for r in rows)

    def _release(self, processor: str, segment_id: int, owner: str, hold_off: float) -> bool:
        params = (owner, int(hold_off * 1000), processor, segment_id, owner)
        [(count,)] = self._write(self._release_sql, params)
        return count == 1

    def _store(self, processor: str, segment_id: int, token: Token, owner: str, conn: Any) -> None:
        params = (token.position, token.detail(), self.timeout_ms, processor, segment_id, owner)
        if conn is None:
            with self.db.transaction() as own:
                self._store_in(own, params, processor, segment_id, owner)
        else:
            self._store_in(conn, params, processor, segment_id, owner)

    def _store_in(
        self, conn: Any, params: tuple[Any, ...], processor: str, seg: int, owner: str
    ) -> None:
        cur = conn.execute(self._store_sql, params)
        self.db.sync(conn)  # in pipeline mode the rowcount is known only after a sync
        if cur.rowcount != 1:
            self._lost(conn, processor, seg, owner)

    def _lost(self, conn: Any, processor: str, segment_id: int, owner: str) -> None:
        if conn is None:
            rows = self.db.query(self._owner_sql, (processor, segment_id))
        else:
            rows = conn.execute(self._owner_sql, (processor, segment_id)).fetchall()
        if not rows:
            raise ClaimLostError(f"processor {processor!r} has no segment {segment_id}")
        raise ClaimLostError(
            f"processor {processor!r} segment {segment_id}: claim is held by "
            f"{rows[0][0] or 'nobody'}, not {owner}"
        )

    def _locked_rows(self, conn: Any, processor: str) -> dict[int, tuple[int, Token, str | None]]:
        rows = conn.execute(self._rows_sql, (processor,)).fetchall()
        return {
            r[0]: (r[1], Token.decode(processor, Segment(r[0], r[1]), r[2], r[3]), r[4])
            for r in rows
        }

    def _split(self, processor: str, segment_id: int, owner: str) -> tuple[Segment, Segment]:
        t = self.table
        q = self.db.sql
        with self.db.transaction() as conn:
            rows = self._locked_rows(conn, processor)
            row = rows.get(segment_id)
            keep, new = split_checked(processor, segment_id, row and (row[0], row[2]), owner)
            token = rows[segment_id][1]
            tk, tn = token.for_segment(keep), token.for_segment(new)
            conn.execute(
                q(
                    f"UPDATE {t} SET mask = ?, position = ?, token_detail = ?, request = NULL "
                    "WHERE processor = ? AND segment_id = ?"
                ),
                (keep.mask, tk.position, tk.detail(), processor, keep.id),
            )
            conn.execute(
                q(
                    f"INSERT INTO {t} (processor, segment_id, mask, position, token_detail, "
                    f"updated_at) VALUES (?, ?, ?, ?, ?, {self.db.now_ms})"
                ),
                (processor, new.id, new.mask, tn.position, tn.detail()),
            )
            return keep, new

    def _merge(self, processor: str, segment_id: int, owner: str) -> Segment:
        t = self.table
        q = self.db.sql
        with self.db.transaction() as conn:
            rows = self._locked_rows(conn, processor)
            low, high, merged = merge_rows(processor, rows, segment_id, owner)
            parent = low.merge(high)
            conn.execute(
                q(f"DELETE FROM {t} WHERE processor = ? AND segment_id = ?"), (processor, high.id)
            )
            conn.execute(
                q(
                    f"UPDATE {t} SET mask = ?, position = ?, token_detail = ?, request = NULL "
                    "WHERE processor = ? AND segment_id = ?"
                ),
                (parent.mask, merged.position, merged.detail(), processor, low.id),
            )
            return parent

    def _status(self, processor: str) -> list[SegmentStatus]:
        result = []
        for row in self.db.query(self._status_sql, (processor, processor)):
            (seg_id, mask, pos, detail, owner, since, deadline, request, error, updated, errors,
             retry_at, now, refused, paused) = row  # fmt: skip
            segment, corrupt = Segment(seg_id, mask), None
            try:
                token = Token.decode(processor, segment, pos, detail)
            except CorruptTokenError as exc:  # shown on its row; the other rows still listed
                token, corrupt = Token(pos), exc
            result.append(
                SegmentStatus(
                    processor,
                    segment,
                    token,
                    owner,
                    (now - since) / 1000 if owner and since is not None else None,
                    (deadline - now) / 1000 if owner and deadline is not None else None,
                    request,
                    error,
                    updated / 1000,
                    errors,
                    (retry_at - now) / 1000 if retry_at and retry_at > now else None,
                    bool(paused),
                    refused,
                    corrupt,
                )
            )
        return result

    def _fail(self, processor: str, segment_id: int, owner: str, error: str) -> float:
        t, q, now = self.table, self.db.sql, self.db.now_ms
        with self.db.transaction() as conn:
            row = conn.execute(
                q(f"SELECT owner, errors FROM {t} WHERE processor = ? AND segment_id = ?"),
                (processor, segment_id),
            ).fetchone()
            if row is None or row[0] != owner:
                self._lost(conn, processor, segment_id, owner)
            delay = backoff(row[1] + 1)
            conn.execute(
                q(
                    f"""UPDATE {t} SET owner = NULL, claim_deadline = NULL, claimed_since = NULL,
                        errors = errors + 1, last_error = ?, retry_at = {now} + ?
                    WHERE processor = ? AND segment_id = ?"""
                ),
                (error[:4000], int(delay * 1000), processor, segment_id),
            )
            return delay

    def _request(self, processor: str, segment_id: int, what: str | None) -> bool:
        # A new request clears the last refusal; withdrawing one keeps it for whoever waits.
        refused = "NULL" if what is not None else "refused"
        sql = self.db.sql(
            f"UPDATE {self.table} SET request = ?, refused = {refused} "
            "WHERE processor = ? AND segment_id = ?"
        )
        [(count,)] = self._write(sql, (what, processor, segment_id))
        return count == 1

    def _refuse(self, processor: str, segment_id: int, reason: str, what: str | None) -> bool:
        sql = self.db.sql(
            f"UPDATE {self.table} SET request = NULL, refused = ? "
            "WHERE processor = ? AND segment_id = ? AND request IS NOT NULL "
            "AND (? OR request = ?)"
        )
        params = (reason, processor, segment_id, what is None, what or "")
        [(count,)] = self._write(sql, params)
        return count == 1

    def _set_paused(self, processor: str, paused: bool) -> bool:
        q, pz = self.db.sql, self.paused_table
        if paused:
            sql = q(
                f"INSERT INTO {pz} (processor, paused_at) VALUES (?, {self.db.now_ms}) "
                "ON CONFLICT (processor) DO NOTHING"
            )
        else:
            sql = q(f"DELETE FROM {pz} WHERE processor = ?")
        [(count,)] = self._write(sql, (processor,))
        return count == 1

    def _is_paused(self, processor: str) -> bool:
        return bool(self.db.query(self._is_paused_sql, (processor,))[0][0])

    def _heartbeat(self, processor: str, node: str, leave: bool) -> None:
        n, q = self.nodes_table, self.db.sql
        if leave:
            self._write(q(f"DELETE FROM {n} WHERE processor = ? AND node = ?"), (processor, node))
            return
        self._write(
            q(
                f"INSERT INTO {n} (processor, node, last_seen) VALUES (?, ?, {self.db.now_ms}) "
                f"ON CONFLICT (processor, node) DO UPDATE SET last_seen = excluded.last_seen"
            ),
            (processor, node),
        )

    def _live_nodes(self, processor: str) -> list[str]:
        sql = self.db.sql(
            f"SELECT node FROM {self.nodes_table} WHERE processor = ? "
            f"AND last_seen > {self.db.now_ms} - ? ORDER BY node"
        )
        return [r[0] for r in self.db.query(sql, (processor, self.timeout_ms))]

    def processors(self) -> list[str]:
        rows = self.db.query(f"SELECT DISTINCT processor FROM {self.table} ORDER BY processor")
        return [r[0] for r in rows]
