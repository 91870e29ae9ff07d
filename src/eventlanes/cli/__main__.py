"""``python -m eventlanes.cli``: the ``eventlanes`` command (workers of ``run --processes``
are started this way)."""

from . import main

main()
