"""Tracking tokens: how far a segment has been processed.

A plain token is a position: every event of the segment at or below it is done. After a merge
of two siblings at different positions the merged token also remembers how far the half that
was ahead had got (``ahead``: (segment id, mask, position) entries), so each event is delivered
only to work that has not yet seen it; Axon re-delivers here. Once processing passes every
``ahead`` position the token collapses back to a plain position.

After a reset a token also carries ``replay_until`` (the furthest position processed before the
reset) and the reset's ``replay_context``: events up to there are replays.

A processor that reads several stores keeps one token per source: the token of the app's own
store, with the others' tokens in ``sources`` (name -> token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidInputError
from ..segments import Segment

Ahead = tuple[int, int, int]  # (segment id, mask, position)


@dataclass(frozen=True, slots=True)
class Token:
    position: int
    ahead: tuple[Ahead, ...] = ()
    replay_until: int | None = None
    replay_context: Any = None
    sources: tuple[tuple[str, Token], ...] = ()

    def source(self, name: str) -> Token:
        """The token of one source ("" is the app's own store)."""
        if not name:
            return self
        for source, token in self.sources:
            if source == name:
                return token
        return Token(0)

    def with_source(self, name: str, token: Token) -> Token:
        if not name:
            return replace(token, sources=self.sources)
        others = tuple((n, t) for n, t in self.sources if n != name) + ((name, token),)
        return replace(self, sources=tuple(sorted(others)))

    def is_replay(self, position: int) -> bool:
        """True when the event at ``position`` was handled before the last reset."""
        return self.replay_until is not None and position <= self.replay_until

    @property
    def replaying(self) -> bool:
        return self.replay_until is not None

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
        replay = self.replay_until is not None and position < self.replay_until
        return Token(
            position,
            tuple(a for a in self.ahead if a[2] > position),
            self.replay_until if replay else None,
            self.replay_context if replay else None,
            self.sources,
        )

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
        return Token(
            base,
            tuple(a for a in kept if a[2] > base),
            self.replay_until,
            self.replay_context,
            tuple((n, t.for_segment(segment)) for n, t in self.sources),
        )

    @staticmethod
    def merged(seg_a: Segment, tok_a: Token, seg_b: Segment, tok_b: Token) -> Token:
        """The token of ``seg_a.merge(seg_b)`` that never re-delivers to either half."""
        if tok_a.replay_until != tok_b.replay_until:
            # One replay end serves the whole merged segment: the other half's first-time
            # events would count as replays (disallow_replay handlers would skip them).
            ends = ", ".join(
                f"{seg} {'up to ' + str(t.replay_until) if t.replaying else 'not replaying'}"
                for seg, t in ((seg_a, tok_a), (seg_b, tok_b))
            )
            raise InvalidInputError(
                f"cannot merge {seg_a} and {seg_b} while their replays end apart ({ends}): "
                "merge once both have passed their replay"
            )
        base = min(tok_a.position, tok_b.position)
        ahead: list[Ahead] = []
        for seg, tok in ((seg_a, tok_a), (seg_b, tok_b)):
            if tok.position > base:
                ahead.append((seg.id, seg.mask, tok.position))
            ahead.extend(a for a in tok.ahead if a[2] > base)
        until = tok_a.replay_until  # the halves' replay ends are equal (checked above)
        names = sorted({n for n, _ in tok_a.sources} | {n for n, _ in tok_b.sources})
        sources = tuple(
            (n, Token.merged(seg_a, tok_a.source(n), seg_b, tok_b.source(n))) for n in names
        )
        context = tok_a.replay_context if until else None
        return Token(base, tuple(sorted(set(ahead))), until, context, sources)

    # -- persistence: ``position`` is a column; everything else is JSON detail ---------------
    def detail(self) -> str | None:
        data: dict[str, Any] = {}
        if self.ahead:
            data["ahead"] = [list(a) for a in self.ahead]
        if self.replay_until is not None:
            data["replay"] = {"until": self.replay_until, "context": self.replay_context}
        if self.sources:
            data["sources"] = {n: [t.position, t.detail()] for n, t in self.sources}
        return json.dumps(data, separators=(",", ":")) if data else None

    @classmethod
    def from_row(cls, position: int, detail: str | None) -> Token:
        if not detail:
            return cls(position)
        data: dict[str, Any] = json.loads(detail)
        ahead = tuple((int(i), int(m), int(pos)) for i, m, pos in data.get("ahead", ()))
        replay = data.get("replay") or {}
        sources = tuple(
            sorted((n, cls.from_row(p, d)) for n, (p, d) in data.get("sources", {}).items())
        )
        return cls(position, ahead, replay.get("until"), replay.get("context"), sources)

    @classmethod
    def reset(cls, before: Token, to: int, context: Any = None) -> Token:
        """The token after a reset to ``to``: events up to ``before.high`` become replays.
        Refused for a merged token whose halves had got to different positions, past ``to``:
        one replay end would make the lagging half's first-time events replays."""
        until = before.high
        if before.ahead and until > max(to, before.position):
            raise InvalidInputError(
                f"it was merged from halves at different positions (handled up to "
                f"{before.position} on one part, {until} on another) and a reset to {to} "
                f"cannot tell their replays apart: run it until it has passed {until}, "
                "then reset"
            )
        if before.replay_until is not None:
            until = max(until, before.replay_until)
        return cls(to, (), until, context) if until > to else cls(to)

    def __str__(self) -> str:
        text = str(self.position)
        if self.ahead:
            text += " (+" + ", ".join(f"{i}/{m}@{p}" for i, m, p in self.ahead) + ")"
        if self.replay_until is not None:
            text += f" (replay to {self.replay_until})"
        for name, token in self.sources:
            text += f" [{name}: {token}]"
        return text
