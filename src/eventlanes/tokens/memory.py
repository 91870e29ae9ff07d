"""In-memory token store: for tests and ephemeral runs only.

Tokens die with the process and there is no database transaction to share, so projections
cannot commit together with their token: exactly-once needs a SQL token store.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ClaimLostError
from ..names import split_version
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


@dataclass
class _Row:
    mask: int
    token: Token
    owner: str | None = None
    claimed_since: float | None = None
    deadline: float | None = None
    released_by: str | None = None
    release_until: float = 0.0
    request: str | None = None
    refused: str | None = None
    last_error: str | None = None
    updated_at: float = 0.0
    errors: int = 0
    retry_at: float = 0.0


class InMemoryTokenStore(TokenStore):
    def __init__(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> None:
        super().__init__(claim_timeout)
        self._rows: dict[str, dict[int, _Row]] = {}
        self._nodes: dict[str, dict[str, float]] = {}
        self._paused: set[str] = set()
        self._version_rows: dict[str, VersionRecord] = {}
        self._lock = threading.Lock()

    def _row(self, processor: str, segment_id: int) -> _Row | None:
        return self._rows.get(processor, {}).get(segment_id)

    def _initialize(self, processor: str, segments: list[Segment], position: int) -> bool:
        with self._lock:
            if self._rows.get(processor):
                return False
            now = time.time()
            self._rows[processor] = {
                s.id: _Row(s.mask, Token(position), updated_at=now) for s in segments
            }
            return True

    def _add_segments(self, processor: str, rows: list[tuple[Segment, int]]) -> list[Segment]:
        with self._lock:
            table = self._rows.setdefault(processor, {})
            created = []
            for segment, position in rows:
                if segment.id not in table:
                    table[segment.id] = _Row(segment.mask, Token(position), updated_at=time.time())
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
        with self._lock:
            if self._rows.get(processor):
                return False
            now = time.time()
            rows = [
                (name, Segment(seg_id, r.mask), r.token, r.owner)
                for name in after
                for seg_id, r in self._rows.get(name, {}).items()
            ]
            tokens = succeeding_tokens(processor, segments, position, rows, per_part, context)
            self._rows[processor] = {
                s.id: _Row(s.mask, tok, updated_at=now)
                for s, tok in zip(segments, tokens, strict=True)
            }
            if split_version(processor)[1] > 1:
                self._version_row(processor, started_at=now)
            return True

    def _version_row(self, processor: str, **times: Any) -> None:
        base, version = split_version(processor)
        row = self._version_rows.get(processor) or VersionRecord(processor, base, version)
        self._version_rows[processor] = replace(row, **times)

    def _versions_of(self, base: str) -> list[VersionRecord]:
        return sorted((r for r in self._version_rows.values() if r.base == base),
                      key=lambda r: r.version)  # fmt: skip

    def _promote(self, processor: str) -> None:
        with self._lock:
            base = split_version(processor)[0]
            last = max((r.promoted_at or 0.0 for r in self._versions_of(base)), default=0.0)
            self._version_row(processor, promoted_at=max(time.time(), last + 0.001))

    def _retire(self, processor: str, owner: str, conn: Any) -> int:
        with self._lock:
            table = self._rows.get(processor, {})
            rows = [(Segment(i, r.mask), r.token, r.owner) for i, r in table.items()]
            position = retire_checked(processor, rows, owner)
            now = time.time()
            self._rows[processor] = {
                0: _Row(
                    0,
                    Token(position),
                    RETIRED,
                    now,
                    float("inf"),
                    last_error=RETIRED_NOTE,
                    updated_at=now,
                )
            }
            self._nodes.pop(processor, None)
            self._paused.discard(processor)
            self._version_row(processor, retired_at=now)
            return len(rows)

    def _claim(
        self, processor: str, segment_id: int, owner: str, ignore_backoff: bool, ignore_pause: bool
    ) -> TokenRecord | None:
        with self._lock:
            row = self._row(processor, segment_id)
            now = time.time()
            if row is None:
                return None
            if processor in self._paused and not ignore_pause:
                return None
            if row.owner not in (None, owner) and (row.deadline or 0) >= now:
                return None
            if row.released_by == owner and row.release_until > now:
                return None
            if row.retry_at > now and not ignore_backoff:
                return None
            if row.owner != owner:
                row.claimed_since = now
            row.owner = owner
            row.deadline = now + self.claim_timeout
            return TokenRecord(processor, Segment(segment_id, row.mask), row.token, owner)

    def _owned(self, processor: str, segment_id: int, owner: str) -> _Row:
        row = self._row(processor, segment_id)
        if row is None:
            raise ClaimLostError(f"processor {processor!r} has no segment {segment_id}")
        if row.owner != owner:
            raise ClaimLostError(
                f"processor {processor!r} segment {segment_id}: claim is held by "
                f"{row.owner or 'nobody'}, not {owner}"
            )
        return row

    def _extend(self, processor: str, segment_id: int, owner: str) -> None:
        with self._lock:
            row = self._owned(processor, segment_id, owner)
            if processor in self._paused:
                raise paused_error(processor)
            row.deadline = time.time() + self.claim_timeout

    def _extend_all(self, processor: str, owner: str) -> list[int]:
        with self._lock:
            if processor in self._paused:
                return []
            ids = []
            for seg_id, row in self._rows.get(processor, {}).items():
                if row.owner == owner:
                    row.deadline = time.time() + self.claim_timeout
                    ids.append(seg_id)
            return sorted(ids)

    def _release(self, processor: str, segment_id: int, owner: str, hold_off: float) -> bool:
        with self._lock:
            row = self._row(processor, segment_id)
            if row is None or row.owner != owner:
                return False
            row.owner = row.deadline = row.claimed_since = None
            row.released_by, row.release_until = owner, time.time() + hold_off
            return True

    def _store(self, processor: str, segment_id: int, token: Token, owner: str, conn: Any) -> None:
        with self._lock:
            row = self._owned(processor, segment_id, owner)
            row.token = token
            row.updated_at = time.time()
            row.deadline = row.updated_at + self.claim_timeout
            row.last_error = None
            row.errors, row.retry_at = 0, 0.0

    def _split(self, processor: str, segment_id: int, owner: str) -> tuple[Segment, Segment]:
        with self._lock:
            row = self._row(processor, segment_id)
            keep, new = split_checked(
                processor, segment_id, None if row is None else (row.mask, row.owner), owner
            )
            assert row is not None  # split_checked raised otherwise
            token = row.token
            row.mask, row.token, row.request = keep.mask, token.for_segment(keep), None
            self._rows[processor][new.id] = _Row(
                new.mask, token.for_segment(new), updated_at=time.time()
            )
            return keep, new

    def _merge(self, processor: str, segment_id: int, owner: str) -> Segment:
        with self._lock:
            table = self._rows.get(processor, {})
            rows = {i: (r.mask, r.token, r.owner) for i, r in table.items()}
            low, high, merged = merge_rows(processor, rows, segment_id, owner)
            parent = low.merge(high)
            del table[high.id]
            row = table[low.id]
            row.mask, row.token, row.request = parent.mask, merged, None
            return parent

    def _status(self, processor: str) -> list[SegmentStatus]:
        with self._lock:
            now = time.time()
            paused = processor in self._paused
            return [
                SegmentStatus(
                    processor,
                    Segment(seg_id, r.mask),
                    r.token,
                    r.owner,
                    now - r.claimed_since if r.owner and r.claimed_since else None,
                    r.deadline - now if r.owner and r.deadline else None,
                    r.request,
                    r.last_error,
                    r.updated_at,
                    r.errors,
                    r.retry_at - now if r.retry_at > now else None,
                    paused,
                    r.refused,
                )
                for seg_id, r in sorted(self._rows.get(processor, {}).items())
            ]

    def _fail(self, processor: str, segment_id: int, owner: str, error: str) -> float:
        with self._lock:
            row = self._owned(processor, segment_id, owner)
            row.errors += 1
            delay = backoff(row.errors)
            row.owner = row.deadline = row.claimed_since = None
            row.last_error, row.retry_at = error[:4000], time.time() + delay
            return delay

    def _request(self, processor: str, segment_id: int, what: str | None) -> bool:
        with self._lock:
            row = self._row(processor, segment_id)
            if row is None:
                return False
            row.request = what
            if what is not None:
                row.refused = None
            return True

    def _refuse(self, processor: str, segment_id: int, reason: str, what: str | None) -> bool:
        with self._lock:
            row = self._row(processor, segment_id)
            if row is None or row.request is None or what not in (None, row.request):
                return False
            row.request, row.refused = None, reason
            return True

    def _set_paused(self, processor: str, paused: bool) -> bool:
        with self._lock:
            was = processor in self._paused
            if paused:
                self._paused.add(processor)
            else:
                self._paused.discard(processor)
            return was != paused

    def _is_paused(self, processor: str) -> bool:
        with self._lock:
            return processor in self._paused

    def _heartbeat(self, processor: str, node: str, leave: bool) -> None:
        with self._lock:
            nodes = self._nodes.setdefault(processor, {})
            if leave:
                nodes.pop(node, None)
            else:
                nodes[node] = time.time()

    def _live_nodes(self, processor: str) -> list[str]:
        with self._lock:
            limit = time.time() - self.claim_timeout
            return sorted(n for n, seen in self._nodes.get(processor, {}).items() if seen > limit)

    def _versions(self, base: str) -> list[VersionRecord]:
        with self._lock:
            return self._versions_of(base)

    def processors(self) -> list[str]:
        with self._lock:
            return sorted(p for p, rows in self._rows.items() if rows)
