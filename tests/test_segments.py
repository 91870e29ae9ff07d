"""Segments partition the routing-hash space, through any splits and merges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eventlanes as el
from eventlanes import Segment


def test_axon_article_example() -> None:
    # A policy value hashing to binary ...011010 belongs to segment 2 of {0/3, 1/3, 2/3, 3/3}.
    value = 0b1011010
    owners = [s for s in Segment.initial(4) if s.matches(value)]
    assert owners == [Segment(2, 3)]


def test_split_merge_and_sibling() -> None:
    root = Segment.root()
    a, b = root.split()
    assert (a, b) == (Segment(0, 1), Segment(1, 1))
    assert Segment(1, 3).split() == (Segment(1, 7), Segment(5, 7))
    assert Segment(5, 7).sibling() == Segment(1, 7)
    assert Segment(1, 7).merge(Segment(5, 7)) == Segment(1, 3)
    assert Segment(5, 7).merge(Segment(1, 7)) == Segment(1, 3)
    assert Segment.initial(1) == [root]
    assert Segment.initial(8) == [Segment(i, 7) for i in range(8)]
    assert str(Segment(2, 3)) == "2/3"


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Segment(0, 2), "mask"),
        (lambda: Segment(0, -1), "mask"),
        (lambda: Segment(0, 2**33 - 1), "mask"),
        (lambda: Segment(4, 3), "id"),
        (lambda: Segment(-1, 3), "id"),
        (lambda: Segment(1, 3).merge(Segment(2, 3)), "only siblings"),
        (lambda: Segment(1, 3).merge(Segment(1, 7)), "only siblings"),
        (lambda: Segment.root().sibling(), "root"),
        (lambda: Segment.root().merge(Segment.root()), "only siblings"),
        (lambda: Segment.initial(0), "from 1 to 4096, got 0"),
        (lambda: Segment.initial(4097), "from 1 to 4096, got 4097"),
        (lambda: Segment.initial(2.0), "whole number"),
        (lambda: Segment.initial(True), "whole number"),
        (lambda: Segment(0, 2**32 - 1).split(), "cannot be split"),
    ],
)
def test_invalid_segments_are_clear_value_errors(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_initial_counts_that_are_not_powers_of_two_split_breadth_first() -> None:
    assert Segment.initial(3) == [Segment(0, 1), Segment(1, 3), Segment(3, 3)]
    assert Segment.initial(5) == [
        Segment(0, 3), Segment(1, 3), Segment(2, 3), Segment(3, 7), Segment(7, 7),
    ]  # fmt: skip
    assert Segment.initial(6) == [
        Segment(0, 3), Segment(1, 3), Segment(2, 7), Segment(3, 7), Segment(6, 7), Segment(7, 7),
    ]  # fmt: skip
    assert Segment.initial(7) == [Segment(0, 3)] + [Segment(i, 7) for i in (1, 2, 3, 5, 6, 7)]
    assert Segment.initial(2) == [Segment(0, 1), Segment(1, 1)]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096), st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30))
def test_initial_segments_partition_the_hash_space_in_a_balanced_tree(n, hashes) -> None:
    segments = Segment.initial(n)
    assert len(segments) == n == len(set(segments))
    assert segments == sorted(segments)
    for h in hashes + [0, 2**32 - 1]:
        assert sum(s.matches(h) for s in segments) == 1
    assert sum(2**32 // s.size for s in segments) == 2**32
    # Balanced: at most two sizes, one twice the other.
    assert max(s.size for s in segments) <= 2 * min(s.size for s in segments)
    # A tree of splits: every segment's sibling is there or split once more, never coarser.
    present = set(segments)
    for s in segments:
        if s.mask:
            sib = s.sibling()
            assert sib in present or set(sib.split()) <= present


@st.composite
def reachable_partitions(draw: st.DrawFn) -> list[Segment]:
    """Any set of segments reachable from the root by random splits and merges."""
    segments = Segment.initial(draw(st.integers(1, 12)))
    for _ in range(draw(st.integers(0, 40))):
        if draw(st.booleans()) or len(segments) == 1:
            seg = draw(st.sampled_from(segments))
            if seg.mask >= 2**20 - 1:
                continue
            segments.remove(seg)
            segments.extend(seg.split())
        else:
            mergeable = [s for s in segments if s.mask and s.sibling() in segments]
            if not mergeable:
                continue
            seg = draw(st.sampled_from(mergeable))
            segments.remove(seg)
            segments.remove(seg.sibling())
            segments.append(seg.merge(seg.sibling()))
    return segments


@settings(max_examples=300, deadline=None)
@given(reachable_partitions(), st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50))
def test_reachable_segments_partition_the_hash_space(segments, hashes) -> None:
    for h in hashes + [0, 2**32 - 1]:
        assert sum(s.matches(h) for s in segments) == 1
    # Exactly: the shares add up to the whole space.
    assert sum(2**32 // s.size for s in segments) == 2**32


def test_stable_hash_is_crc32_of_utf8() -> None:
    from zlib import crc32

    for key in ["user-carlo", "", "Grüße", "🚲"]:
        assert el.stable_hash(key) == crc32(key.encode("utf-8"))
        assert 0 <= el.stable_hash(key) < 2**32
