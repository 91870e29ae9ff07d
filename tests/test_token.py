"""Tracking tokens: merges of siblings at different positions never re-deliver; replay ends
per part keep every first-time event first-time and every replayed event a replay, through
merges, splits and resets in any order (the cases of Axon's merged- and replay-token tests,
as our own, and a model of a processor driven by hypothesis)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlanes import InvalidInputError, Segment, Token

LOW, HIGH = Segment(0, 1), Segment(1, 1)  # even and odd hashes
EVEN, ODD = 0b10, 0b11  # a hash of each


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


# -- merged tokens (the cases of Axon's MergedTrackingTokenTest, as ours) -----------------------
def test_nested_merges_report_the_lowest_position_and_the_furthest_part() -> None:
    quarters = Segment(0, 3), Segment(2, 3), Segment(1, 3), Segment(3, 3)
    low = Token.merged(quarters[0], Token(1), quarters[1], Token(5))
    high = Token.merged(quarters[2], Token(3), quarters[3], Token(3))
    root = Token.merged(LOW, low, HIGH, high)
    assert root.position == 1 and root.high == 5  # the merge position is the furthest part
    assert root.covers(5, 0b10) and not root.covers(5, 0b00)  # only quarter 2/3 got to 5
    assert root.covers(3, 0b01) and root.covers(3, 0b11) and not root.covers(4, 0b01)
    # Advancing between the parts keeps what is still ahead; past them all, plain again.
    assert root.advance(2).ahead == ((1, 1, 3), (2, 3, 5))
    assert root.advance(3).ahead == ((2, 3, 5),)
    assert root.advance(5) == Token(5)
    # The halves split off again are the tokens that were merged.
    assert root.for_segment(LOW) == low and root.for_segment(HIGH) == Token(3)
    assert Token.from_row(root.position, root.detail()) == root


def test_merged_halves_at_one_position_are_a_plain_token() -> None:
    assert Token.merged(LOW, Token(5), HIGH, Token(5)) == Token(5)
    assert Token.merged(LOW, Token(5), HIGH, Token(5)).detail() is None


def test_a_merged_token_holding_two_replaying_halves_keeps_both_when_advanced() -> None:
    """Each half replays to its own end, from its own position; advancing the merged token
    within the replays keeps both ends, and each half's events keep their own flags."""
    low = Token.reset(Token(9), 5, "fix")  # had handled 9, restarts from 5
    high = Token.reset(Token(9), 0, "fix")  # had handled 9, restarts from 0
    merged = Token.merged(LOW, low, HIGH, high)
    assert merged.position == 0 and merged.ahead == ((0, 1, 5),)
    assert merged.replays == ((0, 0, 9),)  # one end for both halves: the whole segment's
    assert merged.detail() == '{"ahead":[[0,1,5]],"replay":{"until":9,"context":"fix"}}'
    advanced = merged.advance(3)
    assert advanced.replaying and advanced.replay_context == "fix"
    assert advanced.is_replay(9, EVEN) and advanced.is_replay(9, ODD)
    assert not advanced.is_replay(10, EVEN) and not advanced.is_replay(10, ODD)
    assert merged.advance(9) == Token(9)


def test_merging_a_replaying_half_with_one_that_is_not() -> None:
    """Before, refused: one replay end for the merged segment would flag the other half's
    first-time events as replays. Now each half keeps its own end, in either order."""
    replaying = Token.reset(Token(12), 0, {"why": "fix"})
    for first, second in ((replaying, Token(0)), (Token(0), replaying)):
        merged = Token.merged(LOW, first, HIGH, second)
        half, other = (EVEN, ODD) if first is replaying else (ODD, EVEN)
        assert merged.is_replay(12, half) and not merged.is_replay(13, half)
        assert not merged.is_replay(1, other)  # never handled: first-time
        assert merged.replay_until == 12 and merged.replaying  # the furthest end (status)
        assert merged.replay_context == {"why": "fix"}
        assert Token.from_row(merged.position, merged.detail()) == merged
        with pytest.raises(ValueError, match="routing hash"):
            merged.is_replay(5)  # the end depends on the part: the hash is needed
        # Split again, each half gets exactly its own replay back.
        assert merged.for_segment(LOW) == (first if first is replaying else Token(0))
        assert merged.for_segment(HIGH) == (second if second is replaying else Token(0))
        assert merged.advance(12) == Token(12)
    assert str(Token.merged(LOW, replaying, HIGH, Token(0))) == "0 (replay 0/1 to 12)"


def test_merging_halves_whose_replays_end_apart() -> None:
    a = Token.reset(Token(12), 0, "fix")
    b = Token.reset(Token(20), 4, "fix")
    merged = Token.merged(LOW, a, HIGH, b)
    assert merged.position == 0 and merged.ahead == ((1, 1, 4),)
    # The lower end holds for the whole segment, the odd half replays further.
    assert merged.replays == ((0, 0, 12), (1, 1, 20))
    assert [merged.is_replay(p, EVEN) for p in (12, 13, 20)] == [True, False, False]
    assert [merged.is_replay(p, ODD) for p in (12, 13, 20, 21)] == [True, True, True, False]
    assert merged.advance(12).replays == ((1, 1, 20),)
    assert merged.advance(12).for_segment(LOW) == Token(12)
    assert Token.from_row(0, merged.detail()) == merged
    # The same ends reached by a split of a reset token: one form, so they compare equal.
    assert Token.merged(LOW, merged.for_segment(LOW), HIGH, merged.for_segment(HIGH)) == merged


def test_replays_of_different_resets_are_not_merged_by_guessing() -> None:
    """A reset gives every segment its context and replaces it on all of them, so halves
    replaying with two contexts come from tokens written by other means: refused, not guessed."""
    with pytest.raises(InvalidInputError, match="different resets"):
        Token.merged(LOW, Token.reset(Token(5), 0, "a"), HIGH, Token.reset(Token(5), 0, "b"))


# -- replay tokens (the cases of Axon's ReplayTokenTest, as ours) -------------------------------
def test_a_replay_ends_with_the_last_event_handled_before_the_reset() -> None:
    token = Token.reset(Token(7), 0, "ctx")
    assert token.position == 0 and token.replay_until == 7  # restarts from the reset position
    for position in range(1, 8):
        assert token.is_replay(position)  # up to and including the last one handled before
        token = token.advance(position)
        assert (token.replay_context == "ctx") == (position < 7)
    assert token == Token(7) and not Token.reset(Token(7), 0).is_replay(8)


def test_a_reset_at_or_beyond_the_position_replays_nothing() -> None:
    assert Token.reset(Token(2), 2) == Token(2)
    assert Token.reset(Token(1), 2) == Token(2)
    assert Token.reset(Token(0), 0, "ctx") == Token(0)


def test_a_reset_during_a_replay_keeps_the_earlier_end() -> None:
    """Events handled before the first reset are still replays after a second one; a reset
    past them ends the replay."""
    first = Token.reset(Token(10), 0, "one").advance(4)
    again = Token.reset(first, 2, "two")
    assert again.replay_until == 10 and again.replay_context == "two"
    assert Token.reset(first, 10) == Token(10)


def test_a_replay_token_of_a_merged_token_round_trips_and_splits() -> None:
    """Before, refused below the far half. The lagging half's events between its position and
    the far half's are first-time; each half replays what it had handled."""
    merged = Token.merged(LOW, Token(12), HIGH, Token(3))
    token = Token.reset(merged, 0, {"reason": "v2"}, Segment.root())
    assert token.replays == ((0, 0, 3), (0, 1, 12))
    assert token.is_replay(12, EVEN) and not token.is_replay(13, EVEN)
    assert token.is_replay(3, ODD) and not token.is_replay(4, ODD)
    stored = json.loads(token.detail() or "")
    assert stored == {"replay": [[0, 0, 3], [0, 1, 12]], "replay_context": {"reason": "v2"}}
    assert Token.from_row(0, token.detail()) == token
    assert token.for_segment(LOW) == Token.reset(Token(12), 0, {"reason": "v2"})
    assert token.for_segment(HIGH) == Token.reset(Token(3), 0, {"reason": "v2"})
    # Reset to a position between the halves: only the far half has anything to replay.
    between = Token.reset(merged, 5, None, Segment.root())
    assert between.replays == ((0, 1, 12),) and between.position == 5
    assert Token.reset(merged, 12, None, Segment.root()) == Token(12)
    assert token.advance(12) == Token(12)


def test_sources_keep_their_own_replay_ends() -> None:
    own = Token.reset(Token(9), 0, "c").with_source("legacy", Token.reset(Token(4), 0, "c"))
    merged = Token.merged(LOW, own, HIGH, Token(0).with_source("legacy", Token(0)))
    legacy = merged.source("legacy")
    assert legacy.is_replay(4, EVEN) and not legacy.is_replay(4, ODD)
    assert Token.from_row(0, merged.detail()) == merged


# -- the stored form, read by this release and by the one before it -----------------------------
def previous_release_reader(position: int, detail: str | None) -> tuple[Any, ...]:
    """What the release before replay ends per part made of a stored token (its ``from_row``,
    reduced to the values it kept): (position, ahead, replay end, context, sources)."""
    if not detail:
        return (position, (), None, None, ())
    data: dict[str, Any] = json.loads(detail)
    ahead = tuple((int(i), int(m), int(pos)) for i, m, pos in data.get("ahead", ()))
    replay = data.get("replay") or {}
    sources = tuple(
        sorted((n, previous_release_reader(p, d)) for n, (p, d) in data.get("sources", {}).items())
    )
    return (position, ahead, replay.get("until"), replay.get("context"), sources)


def test_rows_of_the_previous_release_load_unchanged() -> None:
    in_source = json.dumps({"replay": {"until": 9, "context": None}}, separators=(",", ":"))
    rows = {
        '{"ahead":[[2,3,90]]}': Token(30, ((2, 3, 90),)),
        '{"replay":{"until":40,"context":{"why":"x"}}}': Token(
            30, replays=((0, 0, 40),), replay_context={"why": "x"}
        ),
        '{"replay":{"until":null,"context":null}}': Token(30),
        json.dumps({"sources": {"legacy": [7, in_source]}}): Token(
            30, sources=(("legacy", Token(7, replays=((0, 0, 9),))),)
        ),
    }
    for detail, token in rows.items():
        assert Token.from_row(30, detail) == token, detail
        # What this release writes for them is what the previous one wrote.
        assert previous_release_reader(30, token.detail()) == previous_release_reader(30, detail)


def test_the_previous_release_reads_what_it_can_express_and_fails_on_the_rest() -> None:
    whole = Token.reset(Token(12), 0, "ctx")
    assert previous_release_reader(0, whole.detail()) == (0, (), 12, "ctx", ())
    apart = Token.merged(LOW, whole, HIGH, Token(0))
    with pytest.raises(AttributeError):  # loudly, before any event is handled
        previous_release_reader(0, apart.detail())
    with pytest.raises(AttributeError):  # also inside a source
        previous_release_reader(0, Token(0).with_source("legacy", apart).detail())


def test_a_detail_written_by_a_newer_release_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="newer eventlanes"):
        Token.from_row(3, '{"ahead":[],"replay_windows":[[0,0,5]]}')


# -- a model of a processor: random advances, splits, merges, resets and appends ---------------
def _canonical(seg: Segment, tok: Token) -> None:
    """Parts lie inside the token's segment; a part that would be the segment is the whole."""
    for seg_id, mask, _ in (*tok.ahead, *tok.replays):
        part = Segment(seg_id, mask)
        assert mask == 0 or (seg.contains(part) and part != seg), (seg, tok)
    assert list(tok.replays) == sorted(tok.replays)


def _old_reading_is_exact(tok: Token, hashes: list[int], head: int) -> None:
    """The previous release either refuses the stored token or reads the same replays."""
    try:
        old = previous_release_reader(tok.position, tok.detail())
    except AttributeError:
        assert tok.replays_by_part or any(t.replays_by_part for _, t in tok.sources)
        return
    until = old[2]
    for position in range(tok.position + 1, head + 1):
        h = hashes[position - 1]
        assert tok.is_replay(position, h) == (until is not None and position <= until)


@st.composite
def processor_histories(draw: st.DrawFn):
    n_events = draw(st.integers(10, 80))
    hashes = [draw(st.integers(0, 2**32 - 1)) for _ in range(n_events)]
    ops = draw(st.lists(st.tuples(st.sampled_from("aasmre"), st.integers(0, 10**6)), max_size=50))
    return hashes, ops


@settings(max_examples=300, deadline=None)
@given(processor_histories())
def test_every_event_handled_once_with_the_right_replay_flag(history) -> None:
    """A model of one processor's segments. Every delivery of an event is recorded with the
    replay flag the token gives it (the token at the start of the batch, as the executors
    read it) and the replay context. The model says: an event is a replay exactly when the
    processor had passed it before (handled it, or a reset passed over it); an event is
    delivered at most once between resets, and each event past a reset's position once
    after it; at the end every token is a plain position at the head."""
    hashes, ops = history
    n = len(hashes)
    rng = random.Random(n)
    head = n // 2  # events appended so far
    tokens: dict[Segment, Token] = {Segment.root(): Token(0)}
    passed = [False] * (n + 1)  # handled, or passed over by a reset
    due = [True] * (n + 1)  # still to be delivered since the last reset
    context: Any = None  # the last reset's

    def advance(seg: Segment, upto: int) -> None:
        tok = tokens[seg]  # the batch's token
        for position in range(tok.position + 1, upto + 1):
            h = hashes[position - 1]
            if not seg.matches(h) or tok.covers(position, h):
                continue
            assert due[position], f"event {position} delivered twice"
            flag = tok.is_replay(position, h)
            assert flag == passed[position], f"event {position}: replay flag {flag}"
            if flag:
                assert tok.replay_context == context
            if not tok.replays_by_part:
                assert tok.is_replay(position) == flag  # the executors' shortcut
            passed[position], due[position] = True, False
        tokens[seg] = tok.advance(upto)

    for op, arg in ops:
        seg = sorted(tokens)[arg % len(tokens)]
        if op == "a":
            advance(seg, min(head, tokens[seg].position + rng.randint(0, n // 3)))
        elif op == "s" and seg.mask < 2**10:
            a, b = seg.split()
            tok = tokens.pop(seg)
            tokens[a], tokens[b] = tok.for_segment(a), tok.for_segment(b)
        elif op == "m" and seg.mask and seg.sibling() in tokens:
            sib = seg.sibling()
            tokens[seg.merge(sib)] = Token.merged(seg, tokens.pop(seg), sib, tokens.pop(sib))
        elif op == "r":
            to = arg % (head + 1)
            context = {"reset": arg}
            tokens = {s: Token.reset(t, to, context, s) for s, t in tokens.items()}
            for position in range(1, n + 1):
                if position <= to and due[position]:
                    passed[position], due[position] = True, False  # passed over
                elif position > to:
                    due[position] = True
        elif op == "e":
            head = min(n, head + 1 + arg % 5)
        for s, t in tokens.items():
            _canonical(s, t)
            assert Token.from_row(t.position, t.detail()) == t
            _old_reading_is_exact(t, hashes, head)
            assert t.replaying == (t.replay_until is not None)
    for seg in list(tokens):
        advance(seg, n)
    assert not any(due[1:]), "events never delivered"
    assert all(tok == Token(n) for tok in tokens.values())
