"""``python -m eventlanes.cli``: the ``eventlanes`` command, through the same entry (its
signal handling first)."""

from .entry import main

main()
