"""Small charts as inline SVG, drawn here from the history (no chart library, no script).

A chart spans from its oldest sample (at least a minute back) to now, at most the history's
length; values are scaled to the largest one shown (or the threshold line, if higher). A
sample without a value (an unknown rate) breaks the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 240
HEIGHT = 48
MIN_SPAN = 60.0


@dataclass(frozen=True)
class Chart:
    line: str  # the path's "d"
    area: str  # the filled area under the line
    top: float  # the value at the top edge
    last: float | None  # the newest value
    peak: float  # the largest value shown
    span: float  # seconds from the left edge to now
    threshold: float | None  # y of a threshold line (None: none)
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def empty(self) -> bool:
        return not self.line


def chart(
    points: Sequence[tuple[float, float | None]],
    now: float,
    longest: float,
    threshold: float | None = None,
) -> Chart:
    """``points``: (epoch seconds, value or None), oldest first."""
    known = [v for _, v in points if v is not None]
    oldest = points[0][0] if points else now
    span = min(longest, max(MIN_SPAN, now - oldest))
    peak = max(known, default=0.0)
    top = max(peak, threshold or 0.0) * 1.1 or 1.0
    runs: list[list[tuple[float, float]]] = [[]]
    for at, value in points:
        if at < now - span:
            continue
        if value is None:
            if runs[-1]:
                runs.append([])
            continue
        x = WIDTH * (1 - (now - at) / span)
        y = HEIGHT * (1 - value / top)
        runs[-1].append((round(x, 1), round(y, 1)))
    line, area = [], []
    for run in runs:
        if not run:
            continue
        line.append("M" + " L".join(f"{x},{y}" for x, y in run))
        area.append(
            f"M{run[0][0]},{HEIGHT} L" + " L".join(f"{x},{y}" for x, y in run)
            + f" L{run[-1][0]},{HEIGHT} Z"
        )  # fmt: skip
    last = points[-1][1] if points else None
    mark = None if threshold is None else round(HEIGHT * (1 - threshold / top), 1)
    return Chart(" ".join(line), " ".join(area), top, last, peak, span, mark)
