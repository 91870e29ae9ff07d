"""Pausing and resuming a processor everywhere."""

from __future__ import annotations

from ..processing.processor import Processor
from ..processing.runtime import Runtime


def pause(rt: Runtime, proc: Processor) -> bool:
    """Pause ``proc`` everywhere: owners store their tokens and release their segments, and
    nobody claims them until :func:`resume`. True if this call paused it."""
    return rt.tokens.pause(proc.name)


def resume(rt: Runtime, proc: Processor) -> bool:
    return rt.tokens.resume(proc.name)
