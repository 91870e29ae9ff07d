"""Tracking tokens: how far a segment has been processed.

A plain token is a position: every event of the segment at or below it is done. After a merge
of two siblings at different positions the merged token also remembers how far the half that
was ahead had got (``ahead``: (segment id, mask, position) entries), so each event is delivered
only to work that has not yet seen it; Axon re-delivers here. Once processing passes every
``ahead`` position the token collapses back to a plain position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..segments import Segment

Ahead = tuple[int, int, int]  # (segment id, mask, position)


@dataclass(frozen=True, slots=True)
class Token:
    position: int
    ahead: tuple[Ahead, ...] = ()

    def covers(self, position: int, routing_hash: int) -> bool:
        """True when the event at ``position`` with ``routing_hash`` was already handled."""
        if position <= self.position:
            return True
        for seg_id, mask, pos in self.ahead:
            if position <= pos and routing_hash & mask == seg_id:
                return True
        return False

    @property
    def high(self) -> int:
        """The furthest position any part of the segment has reached."""
        return max([self.position, *(pos for _, _, pos in self.ahead)])

    @property
    def is_plain(self) -> bool:
        return not self.ahead

    def advance(self, position: int) -> Token:
        """Everything of the segment up to ``position`` is now done."""
        if position <= self.position:
            return self
        return Token(position, tuple(a for a in self.ahead if a[2] > position))

    def for_segment(self, segment: Segment) -> Token:
        """This token restricted to ``segment`` (used when a segment is split)."""
        base = self.position
        kept: list[Ahead] = []
        for seg_id, mask, pos in self.ahead:
            part = Segment(seg_id, mask)
            if part.contains(segment):
                base = max(base, pos)  # the whole of ``segment`` is done up to ``pos``
            elif part.overlaps(segment):
                kept.append((seg_id, mask, pos))
        return Token(base, tuple(a for a in kept if a[2] > base))

    @staticmethod
    def merged(seg_a: Segment, tok_a: Token, seg_b: Segment, tok_b: Token) -> Token:
        """The token of ``seg_a.merge(seg_b)`` that never re-delivers to either half."""
        base = min(tok_a.position, tok_b.position)
        ahead: list[Ahead] = []
        for seg, tok in ((seg_a, tok_a), (seg_b, tok_b)):
            if tok.position > base:
                ahead.append((seg.id, seg.mask, tok.position))
            ahead.extend(a for a in tok.ahead if a[2] > base)
        return Token(base, tuple(sorted(set(ahead))))

    # -- persistence: ``position`` is a column; everything else is JSON detail ---------------
    def detail(self) -> str | None:
        if not self.ahead:
            return None
        return json.dumps({"ahead": [list(a) for a in self.ahead]}, separators=(",", ":"))

    @classmethod
    def from_row(cls, position: int, detail: str | None) -> Token:
        if not detail:
            return cls(position)
        data: dict[str, Any] = json.loads(detail)
        return cls(position, tuple(tuple(a) for a in data.get("ahead", ())))  # type: ignore[misc]

    def __str__(self) -> str:
        if not self.ahead:
            return str(self.position)
        parts = ", ".join(f"{i}/{m}@{p}" for i, m, p in self.ahead)
        return f"{self.position} (+{parts})"
