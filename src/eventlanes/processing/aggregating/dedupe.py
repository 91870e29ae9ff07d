"""Dedupe on source chains: an input folded once per key, whatever republished it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from operator import lt
from typing import Any

from ...events import Event, positions, sources, without_metadata
from ...lineage import CHAIN_KEY, coordinates, is_newer, own_path, record
from ..tables.states import Entry, encode, encode_all


class Marks:
    """What a worker knows of the offsets in its in-memory entries of one held segment: per
    source, a bound at or above the root offset (first path element) of every offset recorded
    for it; and per source and key, the newest own position folded and not yet written into
    the entry's offsets (kept at C speed per batch; the offsets are read only through
    :meth:`encode_offsets`, which includes them, or after :meth:`settle`). Kept and dropped
    together with the entries."""

    __slots__ = ("high", "pending")

    def __init__(self) -> None:
        self.high: dict[str, Any] = {}
        self.pending: dict[str, dict[str, int]] = {}

    def saw(self, entries: Iterable[Entry]) -> None:
        """Raise the bounds to cover the offsets of ``entries`` (loaded or just recorded)."""
        high = self.high
        for entry in entries:
            for src, seen in entry.offsets.items():
                path = seen[1]
                if path and (src not in high or path[0] > high[src]):
                    high[src] = path[0]

    def settle(self, entries: dict[str, Entry]) -> None:
        """Write the pending own positions into the entries' offsets."""
        for src, last in self.pending.items():
            for key, position in last.items():
                entries[key].offsets[src] = ["", [position]]
        self.pending.clear()

    def encode_offsets(self, keys: list[str], picked: list[Entry]) -> list[str]:
        """The offsets of ``picked`` (the entries of ``keys``) as JSON, the pending positions
        included, without writing them into the entries: they stay pending (a dict of plain
        values, which the garbage collector does not track) until an event-by-event batch
        needs them in the offsets."""
        if not self.pending:
            return encode_all([e.offsets for e in picked])
        if len(self.pending) == 1:
            ((src, last),) = self.pending.items()
            head = "{" + encode(src) + ':["",['
            texts = []
            for key, entry in zip(keys, picked, strict=True):
                offsets = entry.offsets
                position = last.get(key)
                if position is not None and (not offsets or (len(offsets) == 1 and src in offsets)):
                    texts.append(f"{head}{position}]]}}")
                else:
                    texts.append(self._merged(key, offsets))
            return texts
        return [self._merged(key, entry.offsets) for key, entry in zip(keys, picked, strict=True)]

    def _merged(self, key: str, offsets: dict[str, Any]) -> str:
        merged = dict(offsets)
        for src, last in self.pending.items():
            if key in last:
                merged[src] = ["", [last[key]]]
        return encode(merged)


def dedupe(
    events: list[Event],
    keys: list[str],
    entries: dict[str, Entry],
    source: str,
    marks: Marks | None = None,
) -> list[int]:
    """Indices of ``events`` (keyed ``keys``, every key in ``entries``) not folded in yet, in
    order; the others are counted in their entry's ``dropped``. The result, offsets and counts
    are those of :func:`is_newer` and :func:`record` applied one event after the other.

    The usual batch takes no step per event in Python: events without a chain (metadata that
    is empty, or holds other keys only: a trace context), of one source,
    in increasing positions, the first above every root offset recorded for that source in the
    entries (``marks``): each is newer than its key's offsets (an earlier position of its own
    source is below the first; another partition starts over), so every one is folded and
    each key's offset becomes its last position. Any other batch is checked event by event.
    ``marks``: the worker's, kept across batches (offsets left pending there); without it, the
    bounds of the batch's keys are computed and the offsets written at once."""
    own = marks if marks is not None else Marks()
    if marks is None:
        own.saw(entries[k] for k in set(keys))
    n = len(events)
    if n and unchained(events):
        srcs = sources(events)
        if srcs.count(srcs[0]) == n:
            src = srcs[0] or source
            pos = positions(events)
            bound = own.high.get(src)
            if (bound is None or pos[0] > bound) and all(map(lt, pos, islice(pos, 1, None))):
                own.pending.setdefault(src, {}).update(zip(keys, pos, strict=True))
                own.high[src] = pos[-1]
                if marks is None:
                    own.settle(entries)
                return list(range(n))
    own.settle(entries)
    accepted = _dedupe_each(events, keys, entries, source)
    own.saw(entries[k] for k in set(keys))
    return accepted


def unchained(events: Sequence[Event]) -> bool:
    """True when no event carries a source chain, as :func:`_dedupe_each` reads it (a missing
    or empty ``source_chain``). Empty metadata is known without decoding; other metadata (a
    trace context) is decoded, raising CorruptEventError where the row path would."""
    if without_metadata(events):
        return True
    return not any(event.metadata.get(CHAIN_KEY) for event in events)


def _dedupe_each(
    events: list[Event], keys: list[str], entries: dict[str, Entry], source: str
) -> list[int]:
    """:func:`dedupe` one event after the other. An event without a chain is its own root
    ``(source, "", (position,))``: compared with a per-key local, written back to the offsets
    once per batch instead of a list per event."""
    accepted: list[int] = []
    own: dict[tuple[str, str], Any] = {}  # (key, source) -> last own path, None: any is newer
    for i, event in enumerate(events):
        key = keys[i]
        meta = event.metadata
        if not meta.get(CHAIN_KEY):
            src = event.source or source
            last = own.get((key, src), _MISSING)
            if last is _MISSING:
                last = own_path(entries[key].offsets, src)
            path = (event.position,)
            if last is not None and path <= last:
                entries[key].drop(src)
                continue
            own[key, src] = path
        else:
            entry = entries[key]
            coords = coordinates(event, source)
            if (key, coords[0]) in own:  # the local is ahead of the offsets: write it back
                record(entry.offsets, (coords[0], "", own.pop((key, coords[0]))))
            if not is_newer(entry.offsets, coords):
                entry.drop(coords[0])
                continue
            record(entry.offsets, coords)
        accepted.append(i)
    for (key, src), path in own.items():
        record(entries[key].offsets, (src, "", path))
    return accepted


_MISSING = object()
