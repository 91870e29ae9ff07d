"""The ``eventlanes`` command line."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import EventlanesError
from .store import open_store

console = Console()


class _Group(click.Group):
    """Turns eventlanes errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except EventlanesError as exc:
            console.print(f"[red]error:[/red] {exc}")
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="eventlanes")
def main() -> None:
    """Parallel, per-key ordered, resumable, exactly-once event processing."""


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show an event store's size and head position."""
    with open_store(url) as store:
        table = Table(title=f"event store {store.db.url.redacted}")
        table.add_column("backend")
        table.add_column("events", justify="right")
        table.add_column("head position", justify="right")
        table.add_row(store.db.backend, f"{store.count():,}", f"{store.head():,}")
        console.print(table)


if __name__ == "__main__":  # pragma: no cover
    main()
