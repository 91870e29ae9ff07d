"""``dashboard``: the web page of an app's processors (eventlanes.dashboard serves it)."""

from __future__ import annotations

import click

from ..admin.health import MaxLag, parse_max_lag
from ..errors import InvalidInputError
from ..loader import load_app
from .base import log, main


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8321, show_default=True, help="port to listen on")
@click.option("--refresh", default=2.0, show_default=True,
              help="seconds between status polls (and page refreshes)")  # fmt: skip
@click.option("--max-lag", help="unhealthy beyond this lag, as for status: 1000 or 30s")
@click.option("--token-file", metavar="PATH",
              help="the operator token actions need (or $EVENTLANES_DASHBOARD_TOKEN; "
              "without one the dashboard is read-only)")  # fmt: skip
def dashboard(app_spec: str, host: str, port: int, refresh: float, max_lag: str | None,
              token_file: str | None) -> None:  # fmt: skip
    """A web page of processors, ingestors, segments and dead letters with their health,
    rates and lag history; actions (retry, discard, split, merge, release, reset, pause,
    resume, promote, retire) need the operator token. It does not run processors."""
    try:
        from ..dashboard import load_auth, serve
    except ImportError as exc:
        raise InvalidInputError(
            f"the dashboard needs starlette, jinja2 and uvicorn ({exc}): "
            "pip install 'eventlanes[ops]'"
        ) from None
    if not refresh >= 0.1:
        raise InvalidInputError(f"--refresh must be at least 0.1 seconds, got {refresh:g}")
    limit = parse_max_lag(max_lag) if max_lag is not None else MaxLag()
    auth = load_auth(token_file)
    app = load_app(app_spec)
    access = ("read-only (no token set)" if auth.read_only
              else f"actions need the token of {auth.source}")  # fmt: skip
    # The success line once the address is bound: a port in use is one error line, no more.
    ready = lambda url: log.info("dashboard of %s on %s, %s", app_spec, url, access)  # noqa: E731
    serve(app, host, port, refresh, max_lag=limit, auth=auth, name=app_spec, on_ready=ready)
