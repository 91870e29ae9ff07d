"""Segments: ``(id, mask)`` slices of the 32-bit routing-hash space.

An event belongs to the segment whose ``id == hash & mask``. A mask is ``2^k - 1``; splitting
doubles the mask and yields ids ``id`` and ``id + mask + 1``; only siblings (same mask, ids that
differ in the mask's top bit) merge back. The mask is stored with every token row, never
inferred from the set of ids.

A set of segments need not share one mask: ``Segment.initial(3)`` is ``0/1, 1/3, 3/3`` (half,
quarter, quarter), a balanced tree of splits, so any count of segments can be started with.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_MASK = 0xFFFFFFFF
#: Most segments a processor may be initialised with (each is a token row and a claim).
MAX_INITIAL_SEGMENTS = 4096


def _is_valid_mask(mask: int) -> bool:
    return 0 <= mask <= MAX_MASK and mask & (mask + 1) == 0


@dataclass(frozen=True, order=True, slots=True)
class Segment:
    id: int
    mask: int

    def __post_init__(self) -> None:
        if (
            isinstance(self.mask, bool)
            or not isinstance(self.mask, int)
            or not _is_valid_mask(self.mask)
        ):
            raise ValueError(f"invalid segment mask {self.mask!r}: must be 2^k - 1 with k <= 32")
        if (
            isinstance(self.id, bool)
            or not isinstance(self.id, int)
            or not 0 <= self.id <= self.mask
        ):
            raise ValueError(
                f"invalid segment id {self.id!r} for mask {self.mask}: "
                f"need 0 <= id < {self.mask + 1}"
            )

    @classmethod
    def root(cls) -> Segment:
        return cls(0, 0)

    @classmethod
    def initial(cls, n: int) -> list[Segment]:
        """A balanced tree of splits of the root into ``n`` segments (1 <= n <= 4096), by id.

        Split breadth-first until there are ``n``: with ``2^k <= n < 2^(k+1)``, the
        ``n - 2^k`` highest ids of mask ``2^k - 1`` are split once more. So 3 gives
        ``0/1, 1/3, 3/3``; 6 gives ``0/3, 1/3, 2/7, 3/7, 6/7, 7/7``; powers of two share one mask.
        No segment is more than twice the size of another.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INITIAL_SEGMENTS:
            raise ValueError(
                f"segment count must be a whole number from 1 to {MAX_INITIAL_SEGMENTS}, got {n!r}"
            )
        level = 1 << (n.bit_length() - 1)  # the largest power of two <= n
        extra = n - level  # how many of that level's segments are split once more
        segments: list[Segment] = []
        for seg_id in range(level):
            seg = cls(seg_id, level - 1)
            segments.extend(seg.split() if seg_id >= level - extra else (seg,))
        return sorted(segments)

    @property
    def size(self) -> int:
        """How many segments of this mask cover the hash space (1 / share)."""
        return self.mask + 1

    def matches(self, routing_hash: int) -> bool:
        """Whether an event with this routing hash belongs to the segment
        (``hash & mask == id``)."""
        return routing_hash & self.mask == self.id

    def split(self) -> tuple[Segment, Segment]:
        """The two halves of the segment: ``id`` and ``id + mask + 1`` under the next mask."""
        if self.mask == MAX_MASK:
            raise ValueError(f"segment {self} cannot be split further")
        mask = self.mask * 2 + 1
        return Segment(self.id, mask), Segment(self.id + self.mask + 1, mask)

    def parent(self) -> Segment:
        """The segment this one was split from (ValueError for the root, ``0/0``)."""
        if self.mask == 0:
            raise ValueError("the root segment has no parent")
        mask = self.mask >> 1
        return Segment(self.id & mask, mask)

    def sibling(self) -> Segment:
        """The other half of this segment's parent."""
        if self.mask == 0:
            raise ValueError("the root segment has no sibling")
        top = (self.mask + 1) >> 1
        return Segment(self.id ^ top, self.mask)

    def merge(self, other: Segment) -> Segment:
        """The parent of this segment and its sibling ``other`` (ValueError for anything else)."""
        if self.mask == 0 or other != self.sibling():
            raise ValueError(f"only siblings merge: {other} is not the sibling of {self}")
        return self.parent()

    def overlaps(self, other: Segment) -> bool:
        """True when some hash belongs to both (one contains the other)."""
        mask = min(self.mask, other.mask)
        return self.id & mask == other.id & mask

    def contains(self, other: Segment) -> bool:
        """True when every hash of ``other`` belongs to this segment."""
        return self.mask <= other.mask and other.id & self.mask == self.id

    def __str__(self) -> str:
        return f"{self.id}/{self.mask}"
