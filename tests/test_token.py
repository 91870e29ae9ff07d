"""Tracking tokens: merges of siblings at different positions never re-deliver."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlanes import InvalidInputError, Segment, Token


def test_plain_token() -> None:
    t = Token(10)
    assert t.covers(10, 123) and not t.covers(11, 123)
    assert t.advance(20) == Token(20) and t.advance(5) is t
    assert Token.from_row(10, t.detail()) == t and t.detail() is None


def test_merge_remembers_the_half_that_was_ahead() -> None:
    left, right = Segment(0, 1), Segment(1, 1)
    merged = Token.merged(left, Token(100), right, Token(40))
    assert merged.position == 40
    assert merged.covers(80, 0b10)  # left half (even hash) saw position 80 already
    assert not merged.covers(80, 0b11)  # right half did not
    assert not merged.covers(101, 0b10)
    assert merged.high == 100
    assert Token.from_row(merged.position, merged.detail()) == merged
    # Collapses to a plain position once processing passes the half that was ahead.
    assert merged.advance(70).ahead == merged.ahead
    assert merged.advance(100) == Token(100)
    assert str(merged) == "40 (+0/1@100)"


def test_split_keeps_what_each_half_has_seen() -> None:
    merged = Token.merged(Segment(0, 1), Token(100), Segment(1, 1), Token(40))
    # Splitting the merged root again gives each half exactly its old position.
    left, right = Segment.root().split()
    assert merged.for_segment(left) == Token(100)
    assert merged.for_segment(right) == Token(40)


@st.composite
def histories(draw: st.DrawFn):
    """Random event hashes, random split/merge/advance operations on one processor."""
    n_events = draw(st.integers(20, 120))
    hashes = [draw(st.integers(0, 2**32 - 1)) for _ in range(n_events)]
    ops = draw(st.lists(st.tuples(st.sampled_from("sma"), st.integers(0, 10**6)), max_size=40))
    return hashes, ops


@settings(max_examples=200, deadline=None)
@given(histories())
def test_every_event_delivered_exactly_once_through_splits_and_merges(history) -> None:
    """Model of a processor: each segment advances independently by random amounts, splits and
    merges happen at random; at the end every event was delivered once, none twice."""
    hashes, ops = history
    rng = random.Random(len(hashes))
    n = len(hashes)
    tokens: dict[Segment, Token] = {Segment.root(): Token(0)}
    delivered = [0] * (n + 1)

    def advance(seg: Segment, upto: int) -> None:
        tok = tokens[seg]
        for pos in range(tok.position + 1, upto + 1):
            h = hashes[pos - 1]
            if seg.matches(h) and not tok.covers(pos, h):
                delivered[pos] += 1
        tokens[seg] = tok.advance(upto)

    for op, arg in ops:
        seg = sorted(tokens)[arg % len(tokens)]
        if op == "a":
            advance(seg, min(n, tokens[seg].position + rng.randint(0, n // 3)))
        elif op == "s" and seg.mask < 2**10:
            a, b = seg.split()
            tok = tokens.pop(seg)
            tokens[a], tokens[b] = tok.for_segment(a), tok.for_segment(b)
        elif op == "m" and seg.mask and seg.sibling() in tokens:
            sib = seg.sibling()
            tokens[seg.merge(sib)] = Token.merged(seg, tokens.pop(seg), sib, tokens.pop(sib))
    for seg in list(tokens):
        advance(seg, n)
    assert delivered[1:] == [1] * n
    assert all(tok.is_plain and tok.position == n for tok in tokens.values())


def test_merging_halves_whose_replays_end_apart_is_refused() -> None:
    """One replay end serves a merged token: halves replaying to different ends (or one not
    replaying) would turn one half's first-time events into replays."""
    low, high = Segment(0, 1), Segment(1, 1)
    replaying = Token.reset(Token(12), 0)
    with pytest.raises(InvalidInputError, match="replays end apart"):
        Token.merged(low, replaying, high, Token(0))
    with pytest.raises(InvalidInputError, match="replays end apart"):
        Token.merged(low, replaying, high, Token.reset(Token(20), 0))
    both = Token.merged(low, replaying, high, Token.reset(Token(12), 0))
    assert both.replay_until == 12 and both.position == 0
    assert Token.merged(low, Token(12), high, Token(3)).replay_until is None


def test_resetting_a_merged_token_with_halves_apart_is_refused_below_the_far_half() -> None:
    merged = Token.merged(Segment(0, 1), Token(12), Segment(1, 1), Token(3))
    with pytest.raises(InvalidInputError, match="merged from halves at different positions"):
        Token.reset(merged, 0)
    with pytest.raises(InvalidInputError, match="passed 12"):
        Token.reset(merged, 5)
    assert Token.reset(merged, 12) == Token(12)  # nothing to replay: no replay end needed
    assert Token.reset(Token(12), 0).replay_until == 12
