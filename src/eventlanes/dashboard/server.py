"""The dashboard's web server: Starlette routes over a poller that reads the status.

A thread polls the status every ``refresh`` seconds (one reader, however many pages are open)
and keeps the latest poll and the history; pages, ``fragment`` and ``api/...`` read from it.
Every URL the page uses is relative, so the dashboard works behind a reverse proxy under any
path prefix. Actions are JSON POSTs that need the operator token (see auth.py); without one
configured the dashboard is read-only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..admin.health import MaxLag
from ..db.url import parse_url
from ..errors import EventlanesError, InvalidInputError
from . import actions
from .auth import ENV, Auth
from .charts import chart
from .history import History
from .page import plain, snapshot

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("eventlanes.dashboard")
HERE = Path(__file__).parent
#: what every response says to the browser: no framing (clicks on actions), scripts and styles
#: from the dashboard only
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def event_counter(app: App) -> Callable[[int, int], int]:
    """(after, upto) -> the store's events at positions after < p <= upto (committed ones)."""
    store = app.store
    sql = store.db.sql(
        f"SELECT count(*) FROM {store.events_table} WHERE position > ? AND position <= ?"
    )

    def count(after: int, upto: int) -> int:
        return int(store.db.query(sql, (after, upto))[0][0])

    return count


class Poller:
    """Reads the status every ``interval`` seconds in a thread of its own; keeps the latest
    poll (or its error) and the history. ``poll()`` may also be called after an action."""

    def __init__(self, app: App, max_lag: MaxLag, interval: float) -> None:
        self.app = app
        self.max_lag = max_lag
        self.interval = interval
        self.history = History(interval)
        self.latest: dict[str, Any] | None = None
        self.error: str | None = None
        self.at = 0.0
        self._count: Callable[[int, int], int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eventlanes-dashboard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.interval):
                return

    def poll(self) -> None:
        with self._lock:
            at = time.time()
            try:
                if self._count is None:
                    self._count = event_counter(self.app)
                doc = snapshot(self.app, self.max_lag)
                self.history.record(doc, at, self._count)
            except Exception as exc:  # noqa: BLE001 - shown on the page; the next poll retries
                error = f"{type(exc).__name__}: {exc}"
                if error != self.error:  # once per distinct failure, not every poll
                    log.warning("dashboard: reading the status failed: %s", error)
                self.error = error
                return
            if self.error is not None:
                log.warning("dashboard: reading the status works again")
            self.latest, self.error, self.at = doc, None, at

    def current(self) -> tuple[dict[str, Any] | None, str | None, float]:
        if self.latest is None and self.error is None:
            self.poll()  # the first page before the first poll ended
        return self.latest, self.error, self.at


def _keys(status: dict[str, Any]) -> list[str]:
    """The history's keys of a status: each processor's name, ``ingestor:NAME`` per ingestor."""
    keys = [p["name"] for p in status["processors"]]
    return keys + [f"ingestor:{i['name']}" for i in status.get("ingestors", ())]


def _charts(poller: Poller, status: dict[str, Any], now: float) -> dict[str, Any]:
    """Per processor (and ``ingestor:NAME``): rate, ETA and the two small charts."""
    history = poller.history
    limit = poller.max_lag.events
    out: dict[str, Any] = {}
    for key in _keys(status):
        summary = history.summary(key, now)
        samples = summary["samples"]
        out[key] = {
            "rate": summary["rate"],
            "eta": summary["eta"],
            "rate_chart": chart([(s.at, s.rate) for s in samples], now, history.seconds),
            "lag_chart": chart(
                [(s.at, None if s.lag is None else float(s.lag)) for s in samples],
                now,
                history.seconds,
                limit,
            ),  # fmt: skip
        }
    return out


def create_app(
    app: App,
    refresh: float = 2.0,
    *,
    max_lag: MaxLag | None = None,
    auth: Auth | None = None,
    name: str | None = None,
) -> Starlette:
    """The dashboard of ``app`` (``name``: how the header names it, e.g. ``shop:app``)."""
    limit = max_lag or MaxLag()
    guard = auth or Auth()
    poller = Poller(app, limit, refresh)
    header = {
        "app_name": name or "app",
        "store": parse_url(app.url).redacted,
        "read_only": guard.read_only,
        "token_env": ENV,
        "refresh_ms": int(refresh * 1000),
        "max_lag": limit,
    }
    routes = _Routes(app, poller, guard, header)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        poller.start()
        try:
            yield
        finally:
            await run_in_threadpool(poller.stop)

    return Starlette(
        routes=[
            Route("/", routes.index),
            Route("/fragment", routes.fragment),
            Route("/api/status", routes.status_json),
            Route("/api/history", routes.history_json),
            Route("/api/processors/{processor}/{what}", routes.post, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(SecurityHeaders)],
        lifespan=lifespan,
    )


class _Routes:
    """The dashboard's endpoints: pages and history from the poller, the status read now,
    actions behind the token."""

    def __init__(self, app: App, poller: Poller, guard: Auth, header: dict[str, Any]) -> None:
        self.app = app
        self.poller = poller
        self.guard = guard
        self.header = header
        self.templates = Jinja2Templates(directory=HERE / "templates")

    def page(self, request: Request, template: str) -> Response:
        status, error, at = self.poller.current()
        now = time.time()
        context: dict[str, Any] = {"status": status, "error": error, **self.header,
                                   "polled_at": at, "now": now}  # fmt: skip
        if status is not None:
            context["history"] = _charts(self.poller, status, now)
        response = self.templates.TemplateResponse(request, template, context)
        response.headers["Cache-Control"] = "no-store"
        return response

    async def index(self, request: Request) -> Response:
        return await run_in_threadpool(self.page, request, "index.html")

    async def fragment(self, request: Request) -> Response:
        return await run_in_threadpool(self.page, request, "body.html")

    async def status_json(self, request: Request) -> Response:
        """The status document read now (for scripts: never older than the request)."""
        try:
            status = await run_in_threadpool(snapshot, self.app, self.poller.max_lag)
        except Exception as exc:  # noqa: BLE001 - the database may be away: say so
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 503)
        return JSONResponse(plain(status))

    async def history_json(self, request: Request) -> Response:
        """Every processor's and ingestor's samples (what the charts draw)."""
        status, error, _ = await run_in_threadpool(self.poller.current)
        if status is None:
            return JSONResponse({"error": error}, 503)
        now = time.time()
        history = self.poller.history
        out = {}
        for key in _keys(status):
            summary = history.summary(key, now)
            out[key] = {"rate": summary["rate"], "eta": summary["eta"],
                        "samples": [asdict(s) for s in summary["samples"]]}  # fmt: skip
        return JSONResponse({"interval": self.poller.interval, "seconds": history.seconds,
                             "series": out})  # fmt: skip

    def refusal(self, request: Request, name: str, what: str, client: str) -> Response | None:
        """Why an action or a plan is refused before its body is read (token, content type),
        or None."""
        if self.guard.read_only:
            log.warning("dashboard: refused %s of %s from %s: read-only (no token set)", what,
                        name, client)  # fmt: skip
            return JSONResponse(
                {"error": f"the dashboard is read-only: no token is set (${ENV} or "
                 "--token-file)"}, 403,
            )  # fmt: skip
        if not self.guard.allows(request.headers.get("authorization")):
            log.warning("dashboard: refused %s of %s from %s: no or wrong token", what, name,
                        client)  # fmt: skip
            challenge = {"WWW-Authenticate": 'Bearer realm="eventlanes"'}
            return JSONResponse({"error": "refused: no or wrong token"}, 401, headers=challenge)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "actions take an application/json body"}, 415)
        return None

    async def post(self, request: Request) -> Response:
        """An action or a plan: token first (nothing is read before), then a JSON body."""
        name, what = request.path_params["processor"], request.path_params["what"]
        client = request.client.host if request.client else "?"
        refused = self.refusal(request, name, what, client)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise InvalidInputError("the body must be a JSON object")
            if what in actions.PLANS:
                answer = await run_in_threadpool(actions.plan, self.app, name, what, body)
                return JSONResponse(answer)
            message = await run_in_threadpool(actions.act, self.app, name, what, body)
        except (EventlanesError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, 400)
        log.info("dashboard: %s (from %s)", message, client)
        await run_in_threadpool(self.poller.poll)  # the page shows the result at once
        return JSONResponse({"message": message})


class SecurityHeaders:
    """Adds ``HEADERS`` to every HTTP response (plain ASGI: no buffering of bodies)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, sending)
