"""Helpers for testing and benchmarking eventlanes against real databases, and for testing
your own processors (:mod:`.processors`; the pytest plugin :mod:`.pytest_plugin`)."""

from .processors import ProcessorFailed, given, rows, run_until_caught_up, states

__all__ = ["ProcessorFailed", "given", "rows", "run_until_caught_up", "states"]
