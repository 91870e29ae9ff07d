"""Tracking tokens: how far a segment has been processed, and which of its events are replays.

A plain token is a position: every event of the segment at or below it is done. After a merge
of two siblings at different positions the merged token also remembers how far the half that
was ahead had got (``ahead``: (segment id, mask, position) parts), so each event is delivered
only to work that has not yet seen it; Axon re-delivers here. Once processing passes every
``ahead`` position the token collapses back to a plain position.

After a reset a token also carries replay ends, per part in the same way (``replays``: (segment
id, mask, until) parts; the part ``(0, 0)`` is the whole segment): an event of a part at or
below its end was handled before the reset, so it is a replay. A merge keeps each half's end,
a split gives each half the ends that concern it, and a reset of a merged token gives each half
the end it had reached, so no first-time event is taken for a replay and no replay for a
first-time event. The reset's ``replay_context`` goes with them; the token is plain again once
processing passes every end.

A processor that reads several stores keeps one token per source: the token of the app's own
store, with the others' tokens in ``sources`` (name -> token).

Stored form (``token_detail``, JSON; the position is a column of its own)::

    {"ahead": [[id, mask, position], ...],
     "replay": {"until": N, "context": C},      # one end for the whole segment
     "sources": {"name": [position, detail]}}

The ``replay`` object is the form of the release before replay ends per part, and it is still
written whenever a token has one end for its whole segment, so that release reads it. Ends per
part are written as a list, ``"replay": [[id, mask, until], ...], "replay_context": C``: that
release fails loudly on it (it expects an object) instead of reading one part's replays as
first-time events or the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import CorruptTokenError, InvalidInputError
from ..segments import Segment

Part = tuple[int, int, int]  # (segment id, mask, position): a part of a segment and a position
Ahead = Part
WHOLE = Segment.root()  # as a part of a token: the whole of the token's segment
_KNOWN = frozenset({"ahead", "replay", "replay_context", "sources"})


@dataclass(frozen=True, slots=True)
class Token:
    position: int
    ahead: tuple[Part, ...] = ()
    replays: tuple[Part, ...] = ()  # (segment id, mask, until): events up to until are replays
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
        """This token with the token of extra source ``name`` replaced (multi-source processors)."""
        if not name:
            return replace(token, sources=self.sources)
        others = tuple((n, t) for n, t in self.sources if n != name) + ((name, token),)
        return replace(self, sources=tuple(sorted(others)))

    # -- replays ---------------------------------------------------------------------------
    def is_replay(self, position: int, routing_hash: int | None = None) -> bool:
        """True when the event at ``position`` (with ``routing_hash``) was handled before the
        last reset. The hash is needed only where the answer depends on the part (ends per
        part, :attr:`replays_by_part`); without it, that raises ValueError."""
        for seg_id, mask, until in self.replays:  # sorted: the whole segment's end first
            if position <= until:
                if not mask:
                    return True
                if routing_hash is None:
                    raise ValueError(
                        f"token {self} has replay ends per part: is_replay needs the event's "
                        "routing hash"
                    )
                if routing_hash & mask == seg_id:
                    return True
        return False

    @property
    def replaying(self) -> bool:
        """Whether events up to a replay end are still to be flagged as replays."""
        return bool(self.replays)

    @property
    def replay_until(self) -> int | None:
        """The furthest replay end of any part (None when nothing is a replay)."""
        return max(until for _, _, until in self.replays) if self.replays else None

    @property
    def replays_by_part(self) -> bool:
        """True when the replay ends differ between parts of the segment."""
        return any(mask for _, mask, _ in self.replays)

    # -- progress --------------------------------------------------------------------------
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
        """Whether the token is one position (no half of a merge ahead of it)."""
        return not self.ahead

    def advance(self, position: int) -> Token:
        """Everything of the segment up to ``position`` is now done."""
        if position <= self.position:
            return self
        replays = tuple(r for r in self.replays if r[2] > position)
        return Token(
            position,
            tuple(a for a in self.ahead if a[2] > position),
            replays,
            self.replay_context if replays else None,
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
        replays = _normal(_parts(self.replays, segment, base), segment)
        return Token(
            base,
            tuple(a for a in kept if a[2] > base),
            replays,
            self.replay_context if replays else None,
            tuple((n, t.for_segment(segment)) for n, t in self.sources),
        )

    @staticmethod
    def merged(seg_a: Segment, tok_a: Token, seg_b: Segment, tok_b: Token) -> Token:
        """The token of ``seg_a.merge(seg_b)`` that never re-delivers to either half, and keeps
        each half's replay end (a half's end covers that half only)."""
        parent = seg_a.merge(seg_b)
        contexts = [t.replay_context for t in (tok_a, tok_b) if t.replays]
        if len(contexts) == 2 and contexts[0] != contexts[1]:
            # A reset gives every segment its context, and replaces it everywhere: two
            # contexts at once come from tokens written by something else. Not guessed.
            raise InvalidInputError(
                f"cannot merge {seg_a} and {seg_b}: their replays come from different resets "
                f"(contexts {contexts[0]!r} and {contexts[1]!r})"
            )
        base = min(tok_a.position, tok_b.position)
        ahead: list[Ahead] = []
        replays: list[Part] = []
        for seg, tok in ((seg_a, tok_a), (seg_b, tok_b)):
            if tok.position > base:
                ahead.append((seg.id, seg.mask, tok.position))
            ahead.extend(a for a in tok.ahead if a[2] > base)
            # A half's ends concern that half only: its whole-segment end becomes the half's.
            replays.extend(_parts(tok.replays, seg, base, whole=seg))
        names = sorted({n for n, _ in tok_a.sources} | {n for n, _ in tok_b.sources})
        sources = tuple(
            (n, Token.merged(seg_a, tok_a.source(n), seg_b, tok_b.source(n))) for n in names
        )
        ends = _normal(replays, parent)
        context = contexts[0] if ends else None
        return Token(base, tuple(sorted(set(ahead))), ends, context, sources)

    @classmethod
    def reset(cls, before: Token, to: int, context: Any = None, segment: Segment = WHOLE) -> Token:
        """The token of ``segment`` after a reset to ``to``: every event ``before`` had passed
        (handled, or passed over by an earlier reset) becomes a replay, per part: a merged
        token's halves keep their own ends, and the ends of a replay still running are kept."""
        parts = [(0, 0, before.position), *before.ahead, *before.replays]
        replays = _normal([p for p in parts if p[2] > to], segment)
        return cls(to, (), replays, context) if replays else cls(to)

    @classmethod
    def succeeding(
        cls,
        handled: Mapping[str, list[tuple[Segment, Token]]],
        segment: Segment,
        to: int,
        context: Any = None,
        per_part: bool = True,
    ) -> Token:
        """The first token of ``segment`` of a processor that succeeds others (a new version
        of a processor): it starts at ``to``, and every event the others had handled or
        passed over (``handled``: per processor, the token of each of its segments, however
        they are cut) is a replay for it, per part: nothing they had done is done again as
        new, and nothing they had not done is taken for a replay. Per source as well (other
        sources start at their beginning).

        ``per_part=False``: the successor routes events otherwise than they did (another
        key), so their parts say nothing about its own: only what all of one of them had
        passed counts (the lowest position of its segments; the highest of those)."""
        names = sorted({n for rows in handled.values() for _, tok in rows for n, _ in tok.sources})
        token = cls._succeeding(handled, segment, to, context, per_part)
        for name in names:
            by_source = {p: [(s, t.source(name)) for s, t in rows] for p, rows in handled.items()}
            mine = cls._succeeding(by_source, segment, 0, context, per_part)
            if mine.replays:
                token = token.with_source(name, mine)
        return token

    @classmethod
    def _succeeding(
        cls,
        handled: Mapping[str, list[tuple[Segment, Token]]],
        segment: Segment,
        to: int,
        context: Any,
        per_part: bool,
    ) -> Token:
        parts: list[Part] = []
        for rows in handled.values():
            if not per_part:
                if rows:
                    parts.append((0, 0, min(tok.position for _, tok in rows)))
                continue
            for seg, tok in rows:  # as parts of the hash space: (0, 0) is the whole of ``seg``
                for seg_id, mask, until in cls.reset(tok, to, None, seg).replays:
                    parts.append((seg.id, seg.mask, until) if not mask else (seg_id, mask, until))
        replays = _normal(_parts(tuple(parts), segment, to), segment)
        return cls(to, (), replays, context) if replays else cls(to)

    # -- persistence: ``position`` is a column; everything else is JSON detail ---------------
    def detail(self) -> str | None:
        """The JSON stored beside the position (``token_detail``): parts ahead, replay ends,
        sources; None for a plain position."""
        data: dict[str, Any] = {}
        if self.ahead:
            data["ahead"] = [list(a) for a in self.ahead]
        if self.replays_by_part:
            data["replay"] = [list(r) for r in self.replays]
            data["replay_context"] = self.replay_context
        elif self.replays:  # one end for the whole segment: the previous release's form
            data["replay"] = {"until": self.replay_until, "context": self.replay_context}
        if self.sources:
            data["sources"] = {n: [t.position, t.detail()] for n, t in self.sources}
        return json.dumps(data, separators=(",", ":")) if data else None

    @classmethod
    def from_row(cls, position: int, detail: str | None) -> Token:
        if not detail:
            return cls(position)
        data: dict[str, Any] = json.loads(detail)
        unknown = set(data) - _KNOWN
        if unknown:
            # Written by a newer release: guessing would misplace events or replay flags.
            raise InvalidInputError(
                f"token detail {detail[:200]!r} has parts this release does not know "
                f"({', '.join(sorted(unknown))}): was it written by a newer eventlanes?"
            )
        ahead = tuple((int(i), int(m), int(pos)) for i, m, pos in data.get("ahead", ()))
        replay = data.get("replay")
        replays: tuple[Part, ...] = ()
        context = None
        if isinstance(replay, list):
            replays = tuple(sorted((int(i), int(m), int(until)) for i, m, until in replay))
            context = data.get("replay_context")
        elif replay and replay.get("until") is not None:
            replays, context = ((0, 0, int(replay["until"])),), replay.get("context")
        sources = tuple(
            sorted((n, cls.from_row(p, d)) for n, (p, d) in data.get("sources", {}).items())
        )
        return cls(position, ahead, replays, context, sources)

    @classmethod
    def decode(cls, processor: str, segment: Segment, position: int, detail: str | None) -> Token:
        """:meth:`from_row` for a stored row, or CorruptTokenError naming the processor and the
        segment when its detail is not a token this release can read (never a guess)."""
        try:
            return cls.from_row(position, detail)
        except CorruptTokenError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            # InvalidInputError (parts of a newer release) is a ValueError too.
            shown = detail if detail is None or len(detail) <= 200 else detail[:200] + "..."
            reason = (
                str(exc)
                if isinstance(exc, InvalidInputError)
                else (f"token_detail {shown!r} is not a token ({type(exc).__name__}: {exc})")
            )
            raise CorruptTokenError(processor, str(segment), reason) from exc

    def __str__(self) -> str:
        text = str(self.position)
        if self.ahead:
            text += " (+" + ", ".join(f"{i}/{m}@{p}" for i, m, p in self.ahead) + ")"
        if self.replays_by_part:
            ends = ", ".join(f"{i}/{m} to {u}" if m else f"to {u}" for i, m, u in self.replays)
            text += f" (replay {ends})"
        elif self.replays:
            text += f" (replay to {self.replay_until})"
        for name, token in self.sources:
            text += f" [{name}: {token}]"
        return text


def _parts(
    parts: tuple[Part, ...], segment: Segment, floor: int, whole: Segment = WHOLE
) -> list[Part]:
    """The parts that concern ``segment`` and end past ``floor``: a part containing the whole
    segment becomes ``whole`` (the whole of a token of ``segment``, or the segment itself
    when it becomes a half of a merged token)."""
    kept = []
    for seg_id, mask, until in parts:
        if until <= floor:
            continue
        part = Segment(seg_id, mask)
        if part.contains(segment):
            kept.append((whole.id, whole.mask, until))
        elif part.overlaps(segment):
            kept.append((seg_id, mask, until))
    return kept


def _normal(parts: list[Part] | tuple[Part, ...], segment: Segment = WHOLE) -> tuple[Part, ...]:
    """One form for the same ends (so equal tokens compare and store equal), for a token of
    ``segment``: walking down from the segment, each part gets an entry only where the lowest
    end over all of it is beyond the ends above it; the segment's own entry is the whole
    ``(0, 0)``. Parts outside the segment are dropped."""
    ends: dict[Segment, int] = {}
    for seg_id, mask, until in parts:
        part = Segment(seg_id, mask)
        if part.contains(segment):
            part = segment
        elif not segment.contains(part):
            continue
        ends[part] = max(ends.get(part, until), until)

    def inside(node: Segment) -> bool:
        return any(p != node and node.contains(p) for p in ends)

    def lowest(node: Segment) -> int:
        """The lowest end of any hash of ``node``, counting the parts at or below it."""
        own = ends.get(node, 0)
        if not inside(node):
            return own
        low, high = node.split()
        return max(own, min(lowest(low), lowest(high)))

    out: list[Part] = []

    def walk(node: Segment, above: int) -> None:
        end = lowest(node)
        if end > above:
            out.append((0, 0, end) if node == segment else (node.id, node.mask, end))
            above = end
        if inside(node):
            for half in node.split():
                if half in ends or inside(half):
                    walk(half, above)

    walk(segment, 0)
    return tuple(sorted(out))
