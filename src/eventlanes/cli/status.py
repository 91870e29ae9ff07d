"""``info``, ``migrate`` and ``status``: what a store holds, its schema, the processors'
health."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from ..admin.health import (
    MaxLag,
    parse_max_lag,
    processor_document,
    status_document,
    store_first_after,
)
from ..admin.inspect import ReadOnlyInspector
from ..errors import InvalidInputError
from ..kafka import status as kafka_status
from ..loader import load_app, store_url
from ..store import open_store
from .base import console, main, print_table


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show an event store's size and head position (reads only: creates nothing). URL: a
    store URL or MODULE:APP (its store)."""
    with open_store(store_url(url), create=False) as store:
        table = Table(title=f"event store {store.db.url.redacted}")
        table.add_column("backend")
        table.add_column("events", justify="right")
        table.add_column("head position", justify="right")
        table.add_row(store.db.backend, f"{store.count():,}", f"{store.head():,}")
        print_table(table)


@main.command()
@click.argument("url")
@click.option("--check", is_flag=True,
              help="change nothing: say what is pending and exit 1 unless up to date")  # fmt: skip
def migrate(url: str, check: bool) -> None:
    """Create or upgrade a store's tables (its schema version). Run it with a role that may
    create and alter them; the app then runs with SELECT, INSERT, UPDATE and DELETE only."""
    from ..db import open_database
    from ..schema import inspect, latest, migrate

    url = store_url(url)  # MODULE:APP too: its store
    if not check:
        console.print(migrate(url).summary(), highlight=False, soft_wrap=True)
        return
    db = open_database(url, create=False)  # reads only: never creates a file or a table
    try:
        state = inspect(db)
    finally:
        db.close()
    if state.current:
        console.print(f"{state.url}: schema version {state.version}, up to date", highlight=False,
                      soft_wrap=True)  # fmt: skip
        return
    pending = ", ".join(f"{m.version} {m.name}" for m in state.pending) or "none"
    console.print(
        f"{state.url}: {state.describe()}; this eventlanes needs schema version {latest()} "
        f"(pending: {pending})" + (", and knows no version " + ", ".join(map(str, state.unknown))
                                   if state.unknown else ""),
        highlight=False,
        soft_wrap=True,
    )  # fmt: skip
    sys.exit(1)


def _age(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


@main.command()
@click.argument("args", nargs=-1, metavar="[MODULE:APP] [PROCESSOR]...")
@click.option("--processor", "processors", multiple=True, help="only these (repeatable)")
@click.option("--url", help="read this store's tables directly (no app module; read-only)")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON (see README)")
@click.option("--max-lag", help="unhealthy beyond this lag: events (1000) or a duration (30s)")
def status(
    args: tuple[str, ...],
    processors: tuple[str, ...],
    url: str | None,
    as_json: bool,
    max_lag: str | None,
) -> None:
    """Per processor and segment: position, head, lag, owner, claim age, caught up,
    replaying, errors. Exit code 0 when healthy, 1 when a segment has an error, a dead letter
    is parked or the lag exceeds --max-lag.

    \b
    eventlanes status shop:app [PROCESSOR]...
    eventlanes status --url sqlite:///shop.db [PROCESSOR]...
    """
    limit = parse_max_lag(max_lag) if max_lag is not None else MaxLag()
    if url is None:
        if not args:
            raise InvalidInputError("status needs MODULE:APP or --url URL")
        app = load_app(args[0])
        asked = list(args[1:] + processors)
        ingest = [n for n in asked or app.ingestors if n in app.ingestors]
        names = [n for n in asked if n not in app.ingestors] if asked else list(app.processors)
        for name in names:
            app.get(name)
        first_after = store_first_after(app.store)
        docs = [processor_document(app.status(n), first_after, limit) for n in names]
        ingest_docs = [kafka_status.document(app.ingest_status(n), limit.events) for n in ingest]
    else:
        inspector = ReadOnlyInspector(url)
        try:
            asked = list(args + processors)
            known = kafka_status.ingestor_names(inspector.db)
            ingest = [n for n in asked or known if n in known]
            names = [n for n in asked if n not in known] if asked else [
                n for n in inspector.processors() if n not in known]  # fmt: skip
            docs = [processor_document(inspector.view(n), inspector.first_after, limit)
                    for n in names]  # fmt: skip
            ingest_docs = [kafka_status.document(kafka_status.view(inspector.db, n), limit.events)
                           for n in ingest]  # fmt: skip
        finally:
            inspector.close()
    document = status_document(docs, limit, ingest_docs)
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        _print_status(document)
    sys.exit(0 if document["healthy"] else 1)


def _print_ingestors(document: dict[str, Any]) -> None:
    for ing in document.get("ingestors", ()):
        lag = ing["lag_records"]
        title = (
            f"{ing['name']} (Kafka topic {ing['topic']}): {len(ing['live_nodes'])} live node(s), "
            f"lag {'?' if lag is None else f'{lag:,}'} records"
            + (f", {ing['dead_letters']} record(s) parked" if ing["dead_letters"] else "")
        )
        table = Table(title=title)
        for col in ("partition", "position", "high watermark", "lag", "owner", "claim age",
                    "last error"):  # fmt: skip
            table.add_column(col, justify="right" if col in ("position", "lag") else "left")
        for p in ing["partitions"]:
            error = p["last_error"] or ""
            if p["errors"]:
                retry = _age(p["retry_in_seconds"]) or "now"
                error = f"[red]{p['errors']}x, retry in {retry}:[/red] {error}"
            high = p["high_watermark"]
            table.add_row(
                str(p["partition"]),
                f"{p['position']:,}",
                "?" if high is None else f"{high:,} ({_age(p['watermark_age_seconds'])} ago)",
                "?" if p["lag_records"] is None else f"{p['lag_records']:,}",
                p["owner"] or "-",
                _age(p["claim_age_seconds"]),
                error,
            )
        print_table(table)
        for problem in ing["problems"]:
            console.print(f"[red]unhealthy:[/red] {ing['name']}: {problem}", highlight=False)


def _version_note(p: dict[str, Any]) -> str:
    """`` (version 2 of orders: serving)`` for processors with versions (nothing otherwise)."""
    if p.get("version", 1) == 1 and p.get("serving", True):
        return ""
    if p["serving"]:
        how = "serving"
    elif p["behind_events"] is not None:
        how = f"not serving, {p['behind_events']:,} behind the serving version"
    else:
        how = "not serving"
    return f" (version {p['version']} of {p['base']}: {how})"


def _print_status(document: dict[str, Any]) -> None:
    _print_ingestors(document)
    for p in document["processors"]:
        readable = "" if p["readable_head"] == p["head"] else f" (readable {p['readable_head']:,})"
        title = (
            f"{p['name']}{_version_note(p)}: {'paused, ' if p['paused'] else ''}"
            f"head {p['head']:,}{readable}, "
            f"{len(p['live_nodes'])} live node(s), "
            f"lag {p['lag_events']:,} events / {p['lag_seconds']:,.1f} s"
            + (f", {p['dead_letters']} dead letter(s)" if p["dead_letters"] else "")
        )
        table = Table(title=title)
        for col in ("segment", "position", "lag", "lag (s)", "owner", "claim age", "caught up",
                    "replaying", "last error"):  # fmt: skip
            table.add_column(
                col, justify="right" if col.startswith(("position", "lag")) else "left"
            )
        for s in p["segments"]:
            error = s["last_error"] or ""
            if s["errors"]:
                retry = _age(s["retry_in_seconds"]) or "now"
                error = f"[red]{s['errors']}x, retry in {retry}:[/red] {error}"
            table.add_row(
                s["segment"],
                f"{s['position']:,}",
                f"{s['lag_events']:,}",
                f"{s['lag_seconds']:,.1f}",
                s["owner"] or "-",
                _age(s["claim_age_seconds"]),
                "yes" if s["caught_up"] else "no",
                f"until {s['replay_until']:,}" if s["replaying"] else "no",
                error + (f" [{s['request']} requested]" if s["request"] else ""),
            )
        print_table(table)
        for problem in p["problems"]:
            console.print(f"[red]unhealthy:[/red] {p['name']}: {problem}", highlight=False)
        for note in p["notes"]:
            console.print(f"[yellow]note:[/yellow] {p['name']}: {note}", highlight=False)
