"""The open windows of a held segment queued to close, by end: many windows end together
(every key's window of a step), so each end is queued once with the windows that end there,
and the store's clock closes them an end at a time."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator


class Ends:
    """``(end, key, start)`` queued; an entry whose window has since moved its end (a session
    that grew) stays and is passed over by whoever closes it."""

    __slots__ = ("by_end", "heap")

    def __init__(self, queued: Iterable[tuple[int, str, int]] = ()) -> None:
        self.heap: list[int] = []  # the distinct ends queued
        self.by_end: dict[int, list[tuple[str, int]]] = {}
        for end, key, start in queued:
            self.push(end, key, start)

    def push(self, end: int, key: str, start: int) -> None:
        members = self.by_end.get(end)
        if members is None:
            members = self.by_end[end] = []
            heapq.heappush(self.heap, end)
        members.append((key, start))

    def __bool__(self) -> bool:
        return bool(self.heap)

    def through(self, bound: int) -> Iterator[tuple[int, list[tuple[str, int]]]]:
        """Each end at or before ``bound``, earliest first, with its windows, unqueued."""
        heap, by_end = self.heap, self.by_end
        while heap and heap[0] <= bound:
            end = heapq.heappop(heap)
            yield end, by_end.pop(end)
