"""The first tokens of a new version of a processor: every event an earlier version had handled
(or passed over in a reset) when the new one started is a replay for it, and no other, per
part, whatever the two versions' segments look like (a model driven by hypothesis), and the
token stores create them once, atomically, from what the earlier versions had then."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eventlanes import Segment, Token

V = {"version": 2}


def _handled(rows: list[tuple[Segment, Token]], position: int, h: int) -> bool:
    """What the model says: the old version's segment owning hash ``h`` had handled the event
    (its token covers it) or had handled it before a reset (a replay it has not reached)."""
    (token,) = [tok for seg, tok in rows if seg.matches(h)]
    return token.covers(position, h) or token.is_replay(position, h)


def test_a_new_version_replays_per_part_of_the_old_segments() -> None:
    # Version 1: two halves at 50 and 80; version 2 starts with one segment from position 0.
    old = [(Segment(0, 1), Token(50)), (Segment(1, 1), Token(80))]
    new = Token.succeeding({"p": old}, Segment.root(), 0, V)
    assert new.position == 0 and new.replay_context == V and new.replays_by_part
    even, odd = 0b10, 0b11
    assert new.is_replay(50, even) and not new.is_replay(51, even)
    assert new.is_replay(80, odd) and not new.is_replay(81, odd)
    assert Token.from_row(new.position, new.detail()) == new
    # Finer segments than the old ones: each quarter gets its half's end, as one end.
    assert Token.succeeding({"p": old}, Segment(1, 3), 0, V) == Token(0, (), ((0, 0, 80),), V)
    # Nothing handled past where it starts: no replay at all.
    assert Token.succeeding({"p": old}, Segment.root(), 80) == Token(80)
    # Routed otherwise (another key): only what every part had passed.
    coarse = Token.succeeding({"p": old}, Segment.root(), 0, V, per_part=False)
    assert coarse == Token(0, (), ((0, 0, 50),), V)


def test_merged_and_replaying_old_tokens_and_several_versions() -> None:
    merged = Token.merged(Segment(0, 1), Token(100), Segment(1, 1), Token(40))  # 40 (+0/1@100)
    replaying = Token.reset(Token(90), 10, "r", Segment(0, 0))  # replays to 90 from 10
    v2 = Token.succeeding({"a": [(Segment.root(), merged)]}, Segment(0, 1), 0, V)
    assert v2.is_replay(100, 0b10) and not v2.is_replay(101, 0b10)
    v2 = Token.succeeding({"a": [(Segment.root(), merged)]}, Segment(1, 1), 0, V)
    assert v2.is_replay(40, 0b11) and not v2.is_replay(41, 0b11)
    v3 = Token.succeeding(
        {"a": [(Segment.root(), merged)], "b": [(Segment.root(), replaying)]}, Segment(1, 1), 0
    )
    # Version 2 (b) had handled up to 90 before its reset: the union is the furthest.
    assert v3.is_replay(90, 0b11) and not v3.is_replay(91, 0b11)


def test_sources_get_their_replays_too() -> None:
    old = Token(30).with_source("legacy", Token(7))
    new = Token.succeeding({"p": [(Segment.root(), old)]}, Segment.root(), 0, V)
    assert new.is_replay(30) and new.source("legacy").is_replay(7)
    assert not new.source("legacy").is_replay(8)


@st.composite
def versions(draw: st.DrawFn):
    """An old version's segments after random splits, merges, resets and progress; the new
    version's segment count and where it starts."""
    rows: list[tuple[Segment, Token]] = [(Segment.root(), Token(draw(st.integers(0, 40))))]
    for op, pick, n in draw(st.lists(st.tuples(st.sampled_from("smra"), st.integers(0, 99),
                                               st.integers(0, 60)), max_size=25)):  # fmt: skip
        i = pick % len(rows)
        seg, tok = rows[i]
        if op == "s" and seg.mask < 15:
            a, b = seg.split()
            rows[i : i + 1] = [(a, tok.for_segment(a)), (b, tok.for_segment(b))]
        elif op == "m" and seg.mask:
            j = next((k for k, (s, _) in enumerate(rows) if s == seg.sibling()), None)
            if j is not None:
                other = rows[j][1]
                merged = (seg.merge(seg.sibling()), Token.merged(seg, tok, seg.sibling(), other))
                rows = [r for k, r in enumerate(rows) if k not in (i, j)] + [merged]
        elif op == "r":
            rows[i] = (seg, Token.reset(tok, min(n, tok.position), "r", seg))
        else:
            rows[i] = (seg, tok.advance(tok.position + n))
    return rows, draw(st.integers(1, 9)), draw(st.integers(0, 30))


@settings(max_examples=300, deadline=None)
@given(versions(), st.lists(st.tuples(st.integers(1, 160), st.integers(0, 2**32 - 1)),
                            min_size=1, max_size=60))  # fmt: skip
def test_a_new_version_flags_exactly_what_the_old_one_had_handled(case, events) -> None:
    old, segments, start = case
    tokens = {s: Token.succeeding({"v1": old}, s, start, V) for s in Segment.initial(segments)}
    for token in tokens.values():
        assert Token.from_row(token.position, token.detail()) == token  # stored, read back
    for position, h in events:
        if position <= start:
            continue  # the new version never reads these
        (token,) = [t for s, t in tokens.items() if s.matches(h)]
        assert token.is_replay(position, h) == _handled(old, position, h), (position, h)
        # Routed otherwise: never a first-time event taken for a replay.
        (seg,) = [s for s in tokens if s.matches(h)]
        coarse = Token.succeeding({"v1": old}, seg, start, V, per_part=False)
        assert not coarse.is_replay(position, h) or _handled(old, position, h)


def test_token_stores_start_a_version_once_from_the_old_tokens(make_token_store) -> None:
    tokens = make_token_store()
    tokens.initialize("orders", segments=2)
    for seg_id, position in ((0, 50), (1, 80)):
        assert tokens.claim("orders", seg_id, "n1") is not None
        tokens.store("orders", seg_id, Token(position), "n1")
    assert tokens.initialize("orders@v2", segments=3, after=["orders"], context=V)
    assert not tokens.initialize("orders@v2", segments=3, after=["orders"], context=V)
    rows = tokens.status("orders@v2")
    assert [str(s.segment) for s in rows] == ["0/1", "1/3", "3/3"]
    assert [s.token.replays for s in rows] == [((0, 0, 50),), ((0, 0, 80),), ((0, 0, 80),)]
    [record] = tokens.versions("orders")
    assert (record.processor, record.version, record.promoted_at) == ("orders@v2", 2, None)
    assert record.started_at is not None and tokens.versions("other") == []
    # Version 1 keeps its rows and has no row of its own until it is promoted or retired.
    assert [s.position for s in tokens.status("orders")] == [50, 80]
