"""Steering a processor: ``split``, ``merge``, ``release``, ``pause``, ``resume``,
``balance``, ``reset`` and ``dead-letters``."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from ..admin.reset import parse_reset_to
from ..errors import InvalidInputError, ProcessorBusyError
from ..loader import load_app
from ..tracing import configure_from_env
from ..tracing import shutdown as shutdown_tracing
from .base import console, main, print_table


def _steer(what: str) -> Any:
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.argument("processor")
    @click.argument("segment", type=int)
    @click.option(
        "--timeout", default=15.0, show_default=True, help="seconds to wait for the owner"
    )
    def command(app_spec: str, processor: str, segment: int, timeout: float) -> None:
        app = load_app(app_spec)
        console.print(getattr(app, what)(processor, segment, timeout=timeout))

    command.__doc__ = {
        "split": "Split a segment in two (the owner does it, or this command if unclaimed).",
        "merge": "Merge a segment with its sibling.",
        "release": "Ask the owner to release a segment so another node takes it.",
    }[what]
    return main.command(name=what)(command)


for _what in ("split", "merge", "release"):
    _steer(_what)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--to", "to", default="tail", show_default=True, help="tail, head, POSITION or TIME")
@click.option("--wait", is_flag=True, help="wait for running nodes to stop instead of refusing")
@click.option("--timeout", type=float, help="with --wait: give up after this many seconds")
@click.option("--yes", "-y", is_flag=True, help="reset without asking (for scripts)")
def reset(
    app_spec: str, processor: str, to: str, wait: bool, timeout: float | None, yes: bool
) -> None:
    """Reset a stopped processor: run its reset handlers and replay from --to (asks first)."""
    from rich.markup import escape

    app = load_app(app_spec)
    target = parse_reset_to(to)
    plan = app.reset_plan(processor, target)  # read only: nothing changes before the answer
    if plan.held and not wait:
        raise ProcessorBusyError(
            f"processor {processor!r} is running: {', '.join(plan.held)}. Stop it everywhere "
            "first or wait for it (--wait)"
        )
    if plan.held:
        console.print(f"{processor}: still running; counted as of now", highlight=False)
    console.print(plan.summary(), highlight=False)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError(
                f"reset of {processor} to position {plan.to:,} not confirmed: confirm with "
                "--yes (no terminal to ask on)"
            )
        click.confirm(f"Reset {processor} to position {plan.to:,}?", abort=True)
    position = app.reset(processor, target, wait=wait, timeout=timeout)
    if plan.replays:
        done = f"replays {plan.replays:,} event(s) from position {position:,} on the next run"
    else:
        done = f"nothing to replay; continues from position {position:,} on the next run"
    console.print(f"{processor}: reset; {done}", highlight=False)


def _pause(what: str) -> Any:
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.argument("processor")
    def command(app_spec: str, processor: str) -> None:
        app = load_app(app_spec)
        changed = getattr(app, what)(processor)
        past = "paused" if what == "pause" else "resumed"
        console.print(f"{processor}: {past}" if changed else f"{processor}: already {past}")

    command.__doc__ = {
        "pause": "Pause a processor on every node: segments released, not claimed until resumed.",
        "resume": "Resume a paused processor: nodes claim its segments again.",
    }[what]
    return main.command(name=what)(command)


for _what in ("pause", "resume"):
    _pause(_what)


@main.command(name="balance")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--timeout", default=15.0, show_default=True, help="seconds to wait per operation")
def balance_command(app_spec: str, processor: str, timeout: float) -> None:
    """Split or merge segments, one at a time, until the live nodes can share them evenly."""
    app = load_app(app_spec)
    done = app.balance(processor, timeout=timeout)
    for message in done:
        console.print(message)
    segments = app.status(processor).segments
    console.print(
        f"{processor}: balanced, {len(segments)} segment(s)" + ("" if done else " (nothing to do)")
    )


@main.command(name="dead-letters")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--key", help="only the events of this sequence key")
@click.option("--position", type=int, help="only the event at this position")
@click.option("--retry", is_flag=True,
              help="re-run the parked events, in order per key (exit 1 if some stay)")  # fmt: skip
@click.option("--discard", is_flag=True, help="drop the parked events (asks first)")
@click.option("--yes", "-y", is_flag=True, help="--discard without asking")
def dead_letters(
    app_spec: str,
    processor: str,
    key: str | None,
    position: int | None,
    retry: bool,
    discard: bool,
    yes: bool,
) -> None:
    """List, retry or discard a processor's parked events (all, one key or one position)."""
    if retry and discard:
        raise InvalidInputError("use either --retry or --discard")
    app = load_app(app_spec)
    which = " and ".join(
        part for part in (f"key {key!r}" if key is not None else "",
                          f"position {position}" if position is not None else "") if part
    ) or "all keys"  # fmt: skip
    if retry:
        configure_from_env()
        handled, left = app.retry_dead_letters(processor, key=key, position=position)
        shutdown_tracing()
        console.print(f"{processor} ({which}): {handled} event(s) handled, {left} still parked")
        sys.exit(1 if left else 0)  # still parked: not done, whatever the count handled
    letters = app.dead_letter_list(processor, key=key, position=position)
    if discard:
        if not letters:
            console.print(f"{processor} ({which}): no dead letters to discard")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise InvalidInputError(
                    f"--discard would drop {len(letters)} event(s) of {processor} ({which}) "
                    "for good; confirm with --yes (no terminal to ask on)"
                )
            click.confirm(
                f"Discard {len(letters)} parked event(s) of {processor} ({which}) for good? "
                "Their handlers will never run",
                abort=True,
            )
        count = app.discard_dead_letters(processor, key=key, position=position)
        console.print(f"{processor} ({which}): discarded {count} event(s)")
        return
    table = Table(title=f"{processor} ({which}): {len(letters)} dead letter(s)")
    for col in ("position", "key", "stream", "version", "type", "attempts", "error"):
        table.add_column(col)
    for d in letters:
        table.add_row(str(d.position), d.seq_key or "-", d.stream_id, str(d.version), d.type,
                      str(d.attempts), d.error)  # fmt: skip
    print_table(table)
