"""Which event is late and when a window closes, decided by the log.

With the store's clock (the default) the watermark after position ``p`` is ``W(p)``: the
largest (clamped) event time of the inputs up to ``p``, minus the allowed lateness. An input at
``p`` is late for a window iff ``end <= W(p - 1)``, and a window closes at the first position
``p`` where ``W(p) >= end``. Both are functions of the log prefix alone: the same for 1 or 6
segments, after a split or a merge, on every replay and on both engines (a segment only needs
``W`` at its own positions). With a key's clock (for devices that lag by design) the same
rules read the largest time of that key's earlier inputs instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Clock:
    """A watermark: the largest time seen, less ``lateness`` (None before any time)."""

    lateness: int
    latest: int | None = None

    @property
    def watermark(self) -> int | None:
        return None if self.latest is None else self.latest - self.lateness

    def closed(self, end: int) -> bool:
        """A window ending at ``end`` is closed: an input for it now is late."""
        w = self.watermark
        return w is not None and end <= w

    def advance(self, t: int) -> None:
        if self.latest is None or t > self.latest:
            self.latest = t


@dataclass
class KeyClocks:
    """One :class:`Clock` per key (``clock="key"``)."""

    lateness: int
    clocks: dict[str, Clock] = field(default_factory=dict)

    def of(self, key: str) -> Clock:
        clock = self.clocks.get(key)
        if clock is None:
            clock = self.clocks[key] = Clock(self.lateness)
        return clock
