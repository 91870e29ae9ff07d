"""What every pushdown shares: a range folded in the database (:class:`Folded`, per key the
partials of each state field), the abstract :class:`Pushdown` that reads such ranges, and the
merge of their groups into the states, which is the same whatever backend folded them.

A backend (:mod:`.sqlite`, :mod:`.postgres`) says how a range is folded (``_range``); the base
keeps the last range folded, sends a range it cannot fold exactly to the row path
(``rows_until``), and shares and merges the groups.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from ....hashing import stable_hash
from ....upcasting import Upcasters
from ...tables.states import Entry
from ..declarative import NAME, Declaration
from ..dedupe import Marks

if TYPE_CHECKING:
    from ...segment import SegmentState

__all__ = [
    "KIND", "PLACE_SPAN", "SPAN", "STAGED", "TEXT_SPAN", "Field", "Folded", "NotPlaced",
    "Pending", "Pushdown", "RowSource", "marked", "placeable",
]  # fmt: skip

log = logging.getLogger("eventlanes.aggregation")

# The tunables live here, together, so that one module sets them (tests take small ranges).
#: positions folded per range: larger ranges return fewer rows per event (a key seen several
#: times in the range comes back once). It bounds the memory of a range: the states loaded for
#: it (one per key), the groups; SQLite's sorter spills to disk past its cache.
SPAN = 400_000
#: positions per range merged into the stored states inside the database (:class:`Pending`):
#: nothing of it is held in Python (SQLite sorts and stages it on disk past its cache), and each
#: key of a range costs one upsert, so larger ranges cost fewer upserts per event (a range over
#: 1,000,000 uniform keys: 0.63 upserts per event at 1,000,000 positions, 0.43 at 2,000,000).
#: It bounds the work a crash makes redo; the write lock is held about one upsert per key.
PLACE_SPAN = 2_000_000
#: positions whose text SQLite checks at once (the check's memory)
TEXT_SPAN = 50_000
#: a state field's kind as the merge codes it: a group's partial per field is merged by kind
KIND = {"count": 0, "sum": 1, "min": 2, "max": 3, "first": 4, "last": 5}


@dataclass(frozen=True)
class Field:
    """One state field of the groups: its name in the state, kind (:data:`KIND`) and type."""

    out: str
    kind: int
    type: type


#: the temporary table (of the worker's connection) a range merged in place is staged in
STAGED = "el_placed_groups"


def placeable(decl: Declaration, source: str) -> bool:
    """A range of ``decl`` may be merged into the stored states inside the database: every
    field a count, an integer sum, or an integer or text minimum or maximum (what the
    statements merge), and the fields and ``source`` plain names (they stand in JSON paths
    and string literals as they are)."""
    return NAME.fullmatch(source) is not None and all(
        NAME.fullmatch(out)
        and (
            (op.kind in ("count", "sum") and op.type is int)
            or (op.kind in ("min", "max") and op.type in (int, str))
        )
        for out, op in decl.fields.items()
    )


class NotPlaced(Exception):
    """The upsert of a range merged in place failed: nothing of it is written (the write
    transaction rolls back), and it is merged in memory instead."""


class RowSource(Protocol):
    """What a folded range needs of the reader that folded it (the reader, seen from here
    without importing it): its pushdown, and the range's events read again by rows."""

    pushdown: Pushdown | None

    def rows_between(
        self, st: SegmentState, after: int, upto: int, batch_size: int
    ) -> Iterator[list[Any]]: ...


class Folded(list[list[Any]]):
    """One range folded in the database: per key ``(key, events, first position, last
    position, partial per field...)``, with ``events`` in all, the range ``(after, upto]`` and
    the reader to fold it by rows when a segment cannot take it as it is."""

    __slots__ = ("after", "events", "exact", "reader", "upto")

    def __init__(
        self,
        groups: Iterable[list[Any]],
        after: int,
        upto: int,
        reader: RowSource,
        exact: bool = True,
    ) -> None:
        super().__init__(groups)
        self.after = after
        self.upto = upto
        self.reader = reader
        self.events = sum(g[1] for g in self)
        #: False: the range could not be folded in SQL exactly (no groups): fold it by rows
        self.exact = exact

    def part(self, groups: list[list[Any]]) -> Folded:
        return Folded(groups, self.after, self.upto, self.reader)

    def rows(self, st: SegmentState, batch_size: int) -> Iterator[list[Any]]:
        """The range's events for ``st``, read again, in batches (the row path)."""
        return self.reader.rows_between(st, self.after, self.upto, batch_size)


class Pending:
    """A range whose text was checked, to be folded and merged into the stored states inside
    the database by the worker (:meth:`Pushdown.merge_in_place`), or folded into groups
    (:meth:`fold`) when it cannot. Not a list on purpose: a path that does not know it fails
    loudly instead of seeing no events."""

    __slots__ = ("after", "named", "reader", "upto")

    def __init__(self, after: int, upto: int, reader: RowSource, named: list[int]) -> None:
        self.after = after
        self.upto = upto
        self.reader = reader
        #: how many times each property's name is in the range's text (the fold checks them)
        self.named = named

    @property
    def events(self) -> int:
        """The events of the range (its key's name counted in their text: the merge checks
        that each names it once)."""
        return self.named[0]

    def folds(self) -> Iterator[Folded]:
        """The range's groups, read now (the same committed events: the range ends at or
        before the head the reader saw), :data:`SPAN` positions at a time, as a range read to
        be merged in memory is; a part not exact (no groups) is folded by the row path."""
        pushdown = self.reader.pushdown
        assert pushdown is not None  # a pending range comes from a pushdown
        for after in range(self.after, self.upto, SPAN):
            upto = min(self.upto, after + SPAN)
            try:
                groups = pushdown.fold_exactly(after, upto)
            except Exception as exc:  # noqa: BLE001 - the database's errors included: rows tell
                log.debug("range after %d folded by rows: %s", after, exc)
                groups = None
            if groups is None:
                pushdown.rows_until = max(pushdown.rows_until, upto)
                yield Folded([], after, upto, self.reader, exact=False)
            else:
                yield Folded(groups, after, upto, self.reader)


class Pushdown(ABC):
    """One declaration folded over ranges of one store (how: a backend's ``_range``), and the
    merge of the groups into states."""

    store: Any  # the backend's store

    def __init__(self, decl: Declaration, store: Any, upcasters: Upcasters | None = None) -> None:
        self.decl = decl
        self.store = store
        #: the upcasters into the folded types (None: none)
        self.upcasters = upcasters
        self.fields = [Field(out, KIND[op.kind], op.type) for out, op in decl.fields.items()]
        #: positions below which reads take the row path (a range refused lately)
        self.rows_until = 0
        self._last: Folded | Pending | None = None

    @abstractmethod
    def _range(self, after: int, span: int) -> tuple[list[list[Any]] | None, int]:
        """The groups of the range after ``after`` (at most ``span`` positions, up to what a
        reader may see) and its end; None instead of groups: not exact (the row path)."""

    def _native_span(self, after: int, span: int) -> tuple[int, int]:
        """How many positions after ``after`` may be folded in the database, and (when that is
        0) up to where the row path must fold: all of ``span`` unless a backend cannot fold
        some events (:mod:`.sqlite`: those of old types)."""
        return span, after

    #: this backend can merge a range into the stored states itself (:meth:`merge_in_place`):
    #: a range it has only checked (:class:`Pending`, SQLite), or its groups read already
    #: (a :class:`Folded`, PostgreSQL: they are copied into the database)
    places = False
    places_folded = False
    #: its ranges are read only for one held segment over every key (else: the row path)
    whole_only = False

    def _pending(self, after: int, span: int) -> tuple[list[int] | None, int]:
        """A range to merge in place: its end, and the counts of its text's property names
        (None: not exact, the row path). Backends that place ranges say how."""
        raise NotImplementedError

    def fold_exactly(self, after: int, upto: int) -> list[list[Any]] | None:
        """The groups of exactly ``(after, upto]`` (committed, as a pending range's), or None
        when not exact. Backends that place ranges say how."""
        raise NotImplementedError

    def merge_in_place(
        self, name: str, pending: Pending | Folded, store_token: Callable[[Any], None]
    ) -> int | None:
        """Fold ``pending`` into the stored states of aggregation ``name`` inside the database,
        with ``store_token(conn)`` in the same transaction: the events merged, or None when
        nothing was written because the range cannot be merged so exactly (then the merge in
        memory decides). Backends that place say how."""
        raise NotImplementedError

    # -- reading (the reader's thread) --------------------------------------------------------
    def read(
        self, after: int, reader: RowSource, in_place: bool = False
    ) -> tuple[Folded | Pending | None, int]:
        """The range after ``after`` folded in the database, and its end; None when it must
        take the row path (then reads take it up to the range's end). ``in_place`` (a backend
        that :attr:`places`, one segment over every key): the range checked only, to be
        merged into the stored states by the worker (:class:`Pending`). The last range read
        is kept: a read ahead that the loop let go (it does at every coordination round, about
        every second, shorter than a large range takes) is asked for again from the same
        position, and the events up to its end do not change. It is only data: states change
        when a worker merges it, once per hand-out, as with events read again."""
        in_place = in_place and self.places
        last = self._last
        if (
            last is not None
            and last.after == after
            and last.reader is reader
            and isinstance(last, Pending) == in_place
        ):
            return last, last.upto
        try:
            span, old_until = self._native_span(after, PLACE_SPAN if in_place else SPAN)
            if span == 0 and old_until > after:  # an old shape first: upcast by the row path
                self.rows_until = old_until
                return None, old_until
            if in_place:
                named, upto = self._pending(after, span)
                if named is None:
                    self.rows_until = upto
                    return None, upto
                if upto == after:
                    return Folded([], after, upto, reader), upto
                self._last = Pending(after, upto, reader, named)
                return self._last, upto
            groups, upto = self._range(after, span)
        except Exception as exc:  # noqa: BLE001 - the database's errors included: rows tell
            log.debug("range after %d folded by rows: %s", after, exc)
            self.rows_until = after + SPAN
            return None, after
        if groups is None:
            self.rows_until = upto
            return None, upto
        folded = self.folded(groups, after, upto, reader)
        if folded:  # an empty range is cheap, and at the head it would hide what comes next
            self._last = folded
        return folded, upto

    def folded(self, groups: Any, after: int, upto: int, reader: RowSource) -> Folded:
        """What :meth:`_range` returned, as the range the workers take."""
        return Folded(groups, after, upto, reader)

    # -- merging (the worker's thread) --------------------------------------------------------
    def merge(self, folded: Folded, entries: dict[str, Entry], marks: Marks, source: str) -> bool:
        """Fold ``folded`` (one segment's share, every key in ``entries``) into the states, as
        the row path's dedupe fast rule does: False (nothing changed) when a state holds an own
        position at or above the range's first event."""
        if not folded:  # a range without events folded: nothing to merge
            return True
        if not marked(folded, marks, source):
            return False
        self.merge_fields([entries[key].value for key in map(_KEY, folded)], folded, 4)
        return True

    def merge_fields(self, states: list[Any], groups: list[list[Any]], first: int) -> None:
        """Each group's partials (its field ``j`` at ``first + j``) into the state beside it,
        field by field, each kind's loop over the groups: no test of the kind per group."""
        for i, f in enumerate(self.fields, first):
            _MERGES[f.kind](states, groups, f.out, i)

    def share(self, folded: Folded, states: list[SegmentState]) -> dict[SegmentState, list[Any]]:
        """Each group to the held segment of its key (by the key's stable hash)."""
        if len(states) == 1 and states[0].segment.mask == 0:
            return {states[0]: folded}
        parts: dict[SegmentState, list[list[Any]]] = {st: [] for st in states}
        by_mask: dict[int, dict[int, SegmentState]] = {}
        for st in states:
            by_mask.setdefault(st.segment.mask, {})[st.segment.id] = st
        for g in folded:
            h = stable_hash(g[0])
            for mask, ids in by_mask.items():
                owner = ids.get(h & mask)
                if owner is not None:
                    parts[owner].append(g)
                    break
        return {st: folded.part(gs) if gs else [] for st, gs in parts.items()}


# A group's key, first and last position (see Folded).
_KEY, _FIRST, _LAST = itemgetter(0), itemgetter(2), itemgetter(3)


def marked(folded: list[list[Any]], marks: Marks, source: str) -> bool:
    """The dedupe marks of a range's key groups (``[key, events, first, last, ...]``) raised
    to their last positions, as the row path's dedupe fast rule leaves them; False (nothing
    changed) when a state holds an own position at or above the range's first event."""
    bound = marks.high.get(source)
    if bound is not None and min(map(_FIRST, folded)) <= bound:
        return False
    pending = marks.pending.setdefault(source, {})
    pending.update(zip(map(_KEY, folded), map(_LAST, folded), strict=True))
    marks.high[source] = max(map(_LAST, folded))
    return True


def _counts(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    for st, g in zip(states, groups, strict=True):
        st[out] += g[i]


def _sums(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    for st, g in zip(states, groups, strict=True):
        if (v := g[i]) is not None:
            st[out] += v


def _mins(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    for st, g in zip(states, groups, strict=True):
        if (v := g[i]) is not None and ((cur := st[out]) is None or v < cur):
            st[out] = v


def _maxes(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    for st, g in zip(states, groups, strict=True):
        if (v := g[i]) is not None and ((cur := st[out]) is None or v > cur):
            st[out] = v


def _firsts(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    """``(position, value)`` partials: the value, where the state has none yet."""
    for st, g in zip(states, groups, strict=True):
        if (v := g[i]) is not None and st[out] is None:
            st[out] = v[1]


def _lasts(states: list[Any], groups: list[list[Any]], out: str, i: int) -> None:
    for st, g in zip(states, groups, strict=True):
        if (v := g[i]) is not None:
            st[out] = v[1]


#: the merge of one field's partials into the states, by :data:`KIND`
_MERGES = (_counts, _sums, _mins, _maxes, _firsts, _lasts)
