"""``python -m eventlanes``: the ``eventlanes`` command."""

from .cli.entry import main

main()
