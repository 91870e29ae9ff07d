"""``promote`` and ``retire``: switch readers to a processor's version, drop an old one."""

from __future__ import annotations

import sys

import click

from ..errors import InvalidInputError
from ..loader import load_app
from .base import console, main


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("name", metavar="PROCESSOR@vN")
def promote(app_spec: str, name: str) -> None:
    """Switch readers of a processor to one of its versions (orders@v2; orders: version 1)
    once it has caught up: every segment at the head (read now), no failing segment, no
    parked dead letter, not paused. Refused, with every reason, before then."""
    app = load_app(app_spec)
    console.print(app.promote(name), highlight=False, soft_wrap=True)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("name", metavar="PROCESSOR[@vN]")
@click.option(
    "--keep-tables",
    is_flag=True,
    help="leave its tables (for their owner to drop: a role with DML only may not)",
)
@click.option("--yes", "-y", is_flag=True, help="retire without asking (for scripts)")
def retire(app_spec: str, name: str, keep_tables: bool, yes: bool) -> None:  # fmt: skip
    """Drop an old version of a processor for good (orders: version 1; orders@v2): its
    tokens, aggregation states, dead letters and tables (asks first). Refused while readers
    see it or it runs anywhere."""
    app = load_app(app_spec)
    plan = app.retire_plan(name, keep_tables=keep_tables)  # refused here: nothing asked
    console.print(plan.summary(), highlight=False, soft_wrap=True)
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError(
                f"retiring {name} would drop it for good; confirm with --yes (no terminal to "
                "ask on)"
            )
        click.confirm(f"Retire {name} for good? What it drops cannot be restored", abort=True)
    app.retire(name, keep_tables=keep_tables)
    console.print(f"{name}: retired", highlight=False)
