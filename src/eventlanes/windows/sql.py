"""The window start formula in SQL, the same text for SQLite and PostgreSQL: their ``%``
truncates toward zero (``-7 % 5`` is ``-2``, Python's is ``3``), so the floor modulo is
written out, ``((x % step) + step) % step``. Step and offset are integers eventlanes parsed
(:mod:`.durations`), never text from a user."""

from __future__ import annotations


def start_sql(expr: str, step: int, offset: int = 0) -> str:
    """SQL for the start of the window of ``step`` microseconds holding the integer ``expr``
    (a column or a ``?`` placeholder, bound once per occurrence: it appears twice)."""
    step, offset = int(step), int(offset)  # integers only: the text below is not a parameter
    if step <= 0:
        raise ValueError(f"a window step must be positive, got {step}")
    return f"({expr} - ((({expr} - {offset}) % {step}) + {step}) % {step})"
