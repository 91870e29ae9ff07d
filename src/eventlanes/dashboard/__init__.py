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

import errno
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import InvalidInputError
from .auth import Auth, load_auth
from .page import snapshot
from .server import HERE, create_app

if TYPE_CHECKING:
    from ..admin.health import MaxLag
    from ..app import App

__all__ = ["HERE", "Auth", "create_app", "listen", "load_auth", "serve", "snapshot"]


def serve(
    app: App,
    host: str = "127.0.0.1",
    port: int = 8321,
    refresh: float = 2.0,
    *,
    max_lag: MaxLag | None = None,
    auth: Auth | None = None,
    name: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the dashboard until stopped; ``on_ready`` is called with its URL once the
    address is bound (never when it cannot be: :func:`listen` says why)."""
    import uvicorn

    sock = listen(host, port)  # first: a port in use is one clear error, before any success line
    try:
        web = create_app(app, refresh, max_lag=max_lag, auth=auth, name=name)
        # warning: no access log (it would name every poll; tokens travel in headers, never URLs)
        server = uvicorn.Server(uvicorn.Config(web, log_level="warning"))
        if on_ready is not None:
            on_ready(f"http://{_address(host, sock.getsockname()[1])}/")
        server.run(sockets=[sock])
    finally:
        sock.close()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (as uvicorn binds one), or InvalidInputError
    naming the address and why it cannot be had (in use, not this machine's, no such host)."""
    where = _address(host, port)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInputError(f"cannot listen on {where}: {exc}") from None
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = "the address is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise InvalidInputError(
            f"cannot listen on {where}: {why} (choose another --port, or stop what listens there)"
        ) from None
    sock.set_inheritable(True)
    return sock
