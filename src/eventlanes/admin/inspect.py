"""A read-only inspector of a store: status without the app's code."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from .. import schema
from ..db import Database, open_database
from ..db.url import parse_url
from ..errors import InvalidInputError, SchemaError
from ..names import split_version
from ..processing.tables.states import dropped_by_source
from ..segments import Segment
from ..store.base import ReadWait, committed_head, recorded_after
from ..tokens import DEFAULT_CLAIM_TIMEOUT, SegmentStatus, Token
from ..tokens.base import RETIRED, VersionRecord
from .views import (
    ProcessorView,
    VersionView,
    measured_head,
    processor_view,
    serving_version,
    unreadable,
    version_view,
)

#: what decoding a token row raises when its detail is not a token's (JSON or not): the error
#: the token store raises (a ValueError) or, for shapes it does not check, Python's own
UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)


def token_rows(db: Database, table: str, name: str) -> tuple[list[SegmentStatus], dict[int, str]]:
    """The token rows of processor ``name``, each decoded on its own: one that cannot be read
    is kept with its position column and named in the second result (segment id -> why), so
    status still shows every other segment. A claim whose deadline passed is held by nobody
    (any node may take it)."""
    now = db.now_ms
    rows = db.query(
        db.sql(
            f"""SELECT segment_id, mask, position, token_detail, owner, claimed_since,
                    claim_deadline, request, last_error, errors, retry_at, updated_at, {now}
                FROM {table} WHERE processor = ? ORDER BY segment_id"""
        ),
        (name,),
    )
    found, corrupt = [], {}
    for seg_id, mask, pos, detail, owner, since, deadline, request, error, errors, retry_at, \
            updated, at in rows:  # fmt: skip
        live = owner if owner and deadline is not None and deadline >= at else None
        try:
            token = Token.decode(name, Segment(seg_id, mask), pos, detail)
        except UNREADABLE as exc:  # CorruptTokenError, or Python's own for shapes not checked
            token, corrupt[seg_id] = Token(pos), str(unreadable(exc))
        found.append(
            SegmentStatus(
                name,
                Segment(seg_id, mask),
                token,
                live,
                (at - since) / 1000 if live and since is not None else None,
                (deadline - at) / 1000 if live else None,
                request,
                error,
                updated / 1000,
                errors,
                (retry_at - at) / 1000 if retry_at and retry_at > at else None,
            )
        )
    return found, corrupt


class ReadOnlyInspector:
    """Status of every processor of a store, from its tables alone; never writes: the
    database is opened read-only (SQLite ``mode=ro``, PostgreSQL read-only sessions), so it
    also reads a store on a read-only mount. A store of a newer schema than this eventlanes
    knows is refused (its tables may mean something else); older ones are read as they
    are."""

    def __init__(self, url: str) -> None:
        parsed = parse_url(url)
        if parsed.backend == "sqlite" and not Path(parsed.target).expanduser().is_file():
            raise InvalidInputError(f"no SQLite store at {parsed.target!r}")
        self.db: Database = open_database(parsed, create=False)
        try:
            state = schema.inspect(self.db)
        except BaseException:
            self.db.close()
            raise
        if state.unknown:
            self.db.close()
            raise SchemaError(
                f"store {state.url!r} has schema version {state.version}, newer than this "
                f"eventlanes (it knows versions up to {schema.latest()}): read its status with "
                "the eventlanes release that migrated it, or a later one"
            )
        #: drops by source are kept from schema version 4 on (an older store is read as it is)
        self._dropped_by = (state.version or 0) >= 4
        self.tokens = self.db.table("tokens")
        self.nodes = self.db.table("nodes")
        self.letters = self.db.table("dead_letters")
        self.events = self.db.table("events")
        missing = [t for t in (self.tokens, self.events) if not self._exists(t)]
        if missing:
            self.db.close()
            raise InvalidInputError(
                f"{parsed.redacted} has no table {', '.join(missing)}: not an eventlanes store "
                "(wrong URL or prefix?) or nothing has run on it yet"
            )
        self._has_nodes = self._exists(self.nodes)
        self._has_letters = self._exists(self.letters)
        self.paused = self.db.table("paused")
        self._has_paused = self._exists(self.paused)
        self.versions = self.db.table("versions")
        self._has_versions = self._exists(self.versions)  # not in stores before schema 2
        self.states = self.db.table("aggregates")
        self._has_states = self._exists(self.states)

    def _exists(self, table: str) -> bool:
        if self.db.backend == "sqlite":
            sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
            return bool(self.db.query(sql, (table,)))
        return self.db.query("SELECT to_regclass(%s) IS NOT NULL", (table,))[0][0]

    def close(self) -> None:
        self.db.close()

    def processors(self) -> list[str]:
        """Every processor with token rows but the retired ones."""
        rows = self.db.query(
            self.db.sql(
                f"SELECT DISTINCT processor FROM {self.tokens} "
                "WHERE owner IS NULL OR owner <> ? ORDER BY processor"
            ),
            (RETIRED,),
        )
        return [r[0] for r in rows]

    def version(self, name: str, position: int) -> VersionView:
        """Which version of its processor ``name`` is, whether it serves, how far behind."""
        base, version = split_version(name)
        records: list[VersionRecord] = []
        if self._has_versions:
            found = self.db.query(
                self.db.sql(
                    f"SELECT processor, base, version, started_at, promoted_at, retired_at "
                    f"FROM {self.versions} WHERE base = ?"
                ),
                (base,),
            )
            records = [
                VersionRecord(p, b, v, *(None if t is None else t / 1000 for t in times))
                for p, b, v, *times in found
            ]
        lowest = self.db.sql(
            f"SELECT min(position), max(owner) FROM {self.tokens} WHERE processor = ?"
        )

        def first_ran() -> bool:  # token rows of version 1, not all of them the retired marker
            at, owner = self.db.query(lowest, (base,))[0]
            return at is not None and owner != RETIRED

        current = serving_version(records, first_ran)
        mine = next((r for r in records if r.version == version), None)

        def lowest_position(stored: str) -> int | None:
            return self.db.query(lowest, (stored,))[0][0]

        return version_view(base, version, current, position, lowest_position, mine)

    def head(self) -> int:
        return committed_head(self.db, self.events)

    def read_wait(self) -> ReadWait | None:
        if self.db.backend != "postgresql":
            return None
        from ..store.postgres import read_wait

        return read_wait(self.db, self.events)  # type: ignore[arg-type]

    def first_after(self, position: int) -> datetime | None:
        return recorded_after(self.db, self.events, position)

    def segments(self, name: str) -> list[SegmentStatus]:
        """The token rows of processor ``name`` (see :func:`token_rows`)."""
        return token_rows(self.db, self.tokens, name)[0]

    def dropped(self, name: str) -> int | None:
        """Inputs aggregation ``name`` dropped as duplicates (None: no states of that name)."""
        if not self._has_states:
            return None
        sql = self.db.sql(
            f"SELECT count(*), coalesce(sum(dropped), 0) FROM {self.states} WHERE aggregation = ?"
        )
        keys, dropped = self.db.query(sql, (name,))[0]
        return int(dropped) if keys else None

    def dropped_by(self, name: str) -> dict[str, int] | None:
        """Of :meth:`dropped`, how many by root source (None: no states of that name)."""
        if not self._has_states:
            return None
        return dropped_by_source(self.db, self.states, name) if self._dropped_by else {}

    def live_nodes(self, name: str) -> list[str]:
        """Nodes seen within the default claim timeout (the app's is not stored)."""
        if not self._has_nodes:
            return []
        sql = self.db.sql(
            f"SELECT node FROM {self.nodes} WHERE processor = ? "
            f"AND last_seen > {self.db.now_ms} - ? ORDER BY node"
        )
        return [r[0] for r in self.db.query(sql, (name, int(DEFAULT_CLAIM_TIMEOUT * 1000)))]

    def dead_letters(self, name: str) -> int:
        if not self._has_letters:
            return 0
        sql = self.db.sql(f"SELECT count(*) FROM {self.letters} WHERE processor = ?")
        return int(self.db.query(sql, (name,))[0][0])

    def is_paused(self, name: str) -> bool:
        if not self._has_paused:
            return False
        sql = self.db.sql(f"SELECT count(*) FROM {self.paused} WHERE processor = ?")
        return bool(self.db.query(sql, (name,))[0][0])

    def view(self, name: str) -> ProcessorView:
        """The status of processor ``name`` as its tables tell it (no guarantee or declared
        segments: those are the app's)."""
        rows, corrupt = token_rows(self.db, self.tokens, name)
        if not rows:
            raise InvalidInputError(f"no processor {name!r} in this store's token table")
        wait = self.read_wait()
        position = min(s.position for s in rows)
        dropped = self.dropped(name)
        return processor_view(
            name,
            measured_head(wait, self.head),
            rows,
            self.live_nodes(name),
            self.dead_letters(name),
            read_wait=wait,
            version=self.version(name, position),
            paused=self.is_paused(name),
            corrupt=corrupt,
            dropped=dropped,
            dropped_by=None if dropped is None else self.dropped_by(name),
        )
