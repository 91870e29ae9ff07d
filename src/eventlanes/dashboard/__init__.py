"""``eventlanes dashboard mod:app``: a web page to watch and steer an app's processors.

Starlette serves Jinja2 templates (uvicorn runs it); the page refreshes its body every few
seconds with a few lines of ``fetch()`` (static/dashboard.js, no build step, no script or
chart from elsewhere). The parts:

* page.py: what one poll reads: the status document (health.py's rules, the same
  ``--max-lag`` as ``eventlanes status``) and what the page shows beside it;
* history.py: the rates, lags and ETA the dashboard remembers from its own polls (bounded);
* charts.py: small inline SVG charts of that history;
* auth.py: the operator token that actions need (read-only without one);
* actions.py: the App's admin methods behind the buttons, with the command line's refusals;
* server.py: the routes, the poller and the security headers.

The dashboard never runs processors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .auth import Auth, load_auth
from .page import snapshot
from .server import HERE, create_app

if TYPE_CHECKING:
    from ..admin.health import MaxLag
    from ..app import App

__all__ = ["HERE", "Auth", "create_app", "load_auth", "serve", "snapshot"]


def serve(
    app: App,
    host: str = "127.0.0.1",
    port: int = 8321,
    refresh: float = 2.0,
    *,
    max_lag: MaxLag | None = None,
    auth: Auth | None = None,
    name: str | None = None,
) -> None:
    import uvicorn

    web = create_app(app, refresh, max_lag=max_lag, auth=auth, name=name)
    # warning: no access log (it would name every poll; tokens travel in headers, never URLs)
    uvicorn.run(web, host=host, port=port, log_level="warning")
