"""``eventlanes dashboard mod:app``: a web page to watch and steer an app's processors.

Starlette serves Jinja2 templates (uvicorn runs it); the page refreshes its body every few
seconds with a few lines of ``fetch()`` (static/dashboard.js, no build step). Actions are JSON
POSTs to ``/api/...`` that call the App's own admin methods: retry and discard dead letters
(per key or position), split, merge, release, reset. The dashboard never runs processors.

Actions accept only ``application/json`` bodies: a cross-site HTML form cannot send those
without the browser asking first, so another page cannot trigger them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import EventlanesError, InvalidInputError
from ..health import MaxLag, processor_document, status_document, store_first_after

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("eventlanes.dashboard")
HERE = Path(__file__).parent
MAX_LETTERS = 200  # dead letters shown per processor (the count is always exact)
STEERING = ("split", "merge", "release")


def snapshot(app: App) -> dict[str, Any]:
    """The status document plus each processor's dead letters grouped by key."""
    first_after = store_first_after(app.store)
    now = datetime.now(UTC)
    docs = []
    for name in app.processors:
        doc = processor_document(app.status(name), first_after, MaxLag(), now)
        groups: dict[str, dict[str, Any]] = {}
        for d in app.dead_letter_list(name)[:MAX_LETTERS]:
            group_key = d.seq_key if d.seq_key is not None else f"#{d.position}"
            group = groups.setdefault(
                group_key, {"key": d.seq_key, "position": d.position, "letters": []}
            )
            group["letters"].append(d)
        doc["letter_groups"] = list(groups.values())
        docs.append(doc)
    return status_document(docs, MaxLag())


def create_app(app: App, refresh: float = 2.0) -> Starlette:
    templates = Jinja2Templates(directory=HERE / "templates")

    def page(request: Request, template: str) -> Response:
        try:
            context: dict[str, Any] = {"status": snapshot(app), "error": None}
        except Exception as exc:  # noqa: BLE001 - shown on the page; the next refresh retries
            log.warning("dashboard: reading the status failed: %s", exc)
            context = {"status": None, "error": f"{type(exc).__name__}: {exc}"}
        context["refresh_ms"] = int(refresh * 1000)
        return templates.TemplateResponse(request, template, context)

    async def index(request: Request) -> Response:
        return await run_in_threadpool(page, request, "index.html")

    async def fragment(request: Request) -> Response:
        return await run_in_threadpool(page, request, "body.html")

    async def status_json(request: Request) -> Response:
        doc = await run_in_threadpool(snapshot, app)
        for p in doc["processors"]:
            p.pop("letter_groups")
        return JSONResponse(doc)

    async def action(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "actions take an application/json body"}, 415)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise InvalidInputError("the body must be a JSON object")
            message = await run_in_threadpool(
                _act, app, request.path_params["processor"], request.path_params["what"], body
            )
        except (EventlanesError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, 400)
        log.info("dashboard: %s", message)
        return JSONResponse({"message": message})

    return Starlette(
        routes=[
            Route("/", index),
            Route("/fragment", fragment),
            Route("/api/status", status_json),
            Route("/api/processors/{processor}/{what}", action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
    )


def _int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}")
    return value


def _act(app: App, name: str, what: str, body: dict[str, Any]) -> str:
    app.get(name)
    key = body.get("key")
    if key is not None and not isinstance(key, str):
        raise InvalidInputError(f"key must be a string, got {key!r}")
    position = _int(body, "position")
    which = f"key {key!r}" if key is not None else f"position {position}"
    if what == "retry":
        handled, left = app.retry_dead_letters(name, key=key, position=position)
        return f"{name} ({which}): {handled} event(s) handled, {left} still parked"
    if what == "discard":
        count = app.discard_dead_letters(name, key=key, position=position)
        return f"{name} ({which}): discarded {count} event(s)"
    if what in STEERING:
        segment = _int(body, "segment")
        if segment is None:
            raise InvalidInputError(f"{what} needs a segment id")
        return f"{name}: " + getattr(app, what)(name, segment)
    if what == "reset":
        to = body.get("to", "tail")
        if isinstance(to, str) and to.isdigit():
            to = int(to)
        if not isinstance(to, str | int) or isinstance(to, bool):
            raise InvalidInputError(f"reset needs tail, head or a position, got {to!r}")
        position = app.reset(name, to)
        return f"{name}: reset; replays from position {position:,} on the next run"
    raise InvalidInputError(f"unknown action {what!r}")


def serve(app: App, host: str = "127.0.0.1", port: int = 8321, refresh: float = 2.0) -> None:
    import uvicorn

    uvicorn.run(create_app(app, refresh), host=host, port=port, log_level="warning")
