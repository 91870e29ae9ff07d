"""The states an aggregation's worker holds per segment, counted by estimated bytes: what its
memory budget (``state_cache_bytes``) is checked against."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import filterfalse, islice, repeat

__all__ = ["BYTES_PER_CHAR", "STATE_OVERHEAD", "StateCache"]

#: A cached state's bytes, estimated from its JSON text (value and offsets) when it is loaded
#: or written: ``STATE_OVERHEAD + BYTES_PER_CHAR * characters``, no step per event. Measured
#: (Python 3.11, orjson) by deep sys.getsizeof of what the executor held at the end of
#: benchmarks/bench_memory.py's runs (the Entry, key, decoded value and offsets, dict slots
#: after churn, the size kept, a pending position): 990 B per {"sum","n"} state read back (48
#: characters), 830 B per new one (41); and by RSS over 200,000 states held alike, more than
#: {"sum","n"}: 20 int fields 1.0 KB for 205 more characters, 50 ints 1.8 KB for 272, a 1.3 KB
#: string 1.3 KB for 1,279. So 700 + 6 per character: close for numbers, above for text.
STATE_OVERHEAD = 700
BYTES_PER_CHAR = 6


class StateCache:
    """A held segment's cached states, by estimated bytes: per key (in the order they were
    last loaded, changed or written: the oldest first, and the changed ones behind the clean
    ones), their sum, and the part changed since the last write (each counted at its size
    when it was loaded or written). Kept in C-speed steps per key, none per event."""

    __slots__ = ("sizes", "used", "dirty")

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.used = 0
        self.dirty = 0

    def add(self, keys: list[str], chars: Iterable[int]) -> None:
        """Count ``keys`` (distinct) at the ``chars`` of their texts, moved to the end."""
        sizes = self.sizes
        self.used -= sum(map(sizes.pop, keys, repeat(0)))
        new = [STATE_OVERHEAD + BYTES_PER_CHAR * n for n in chars]
        sizes.update(zip(keys, new, strict=True))
        self.used += sum(new)

    def dirtied(self, keys: Collection[str]) -> None:
        """``keys`` (cached, clean until now) changed: counted dirty, moved to the end."""
        sizes = self.sizes
        moved = list(map(sizes.pop, keys))
        sizes.update(zip(keys, moved, strict=True))
        self.dirty += sum(moved)

    def oldest_clean(self, changed: set[str], excess: int) -> list[str]:
        """The clean keys, the oldest first, of ``excess`` bytes or just above (all of them
        when they are fewer), taken by the average size in C-speed slices."""
        sizes = self.sizes
        clean = filterfalse(changed.__contains__, sizes)
        picked: list[str] = []
        found = 0
        while found < excess:
            average = self.used // max(1, len(sizes)) or 1
            more = list(islice(clean, -(-(excess - found) // average)))
            if not more:
                break
            picked += more
            found += sum(map(sizes.__getitem__, more))
        return picked
