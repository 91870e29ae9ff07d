"""What status says about the versions of a processor, and which one serves readers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..tokens.base import VersionRecord


@dataclass(frozen=True)
class VersionView:
    """One version of a processor as ``status`` shows it."""

    base: str  # the processor's name as defined (``orders``)
    version: int
    serving: bool  # readers see this version (``app.table``, ``app.serving``)
    serving_version: int | None  # the version readers see (None: none has run yet)
    behind: int | None  # serving version's position minus this one's (None: this one serves)
    started_at: float | None = None  # epoch seconds its first node created its tokens
    promoted_at: float | None = None  # epoch seconds it was last promoted
    retired: bool = False


def serving_version(
    records: Iterable[VersionRecord], started: Iterable[int], defined: Iterable[int] = ()
) -> int | None:
    """The version readers see: the last one promoted (and not retired); before any promotion,
    the lowest version that has run (``started``: versions with token rows, retired ones not
    included); before anything ran, the lowest version defined (None when none is)."""
    promoted = [r for r in records if r.promoted_at is not None and r.retired_at is None]
    if promoted:
        last = max(promoted, key=lambda r: (r.promoted_at, r.version))
        return last.version
    ran = sorted(started)
    if ran:
        return ran[0]
    known = sorted(defined)
    return known[0] if known else None
