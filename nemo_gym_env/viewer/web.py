"""What the viewer's two apps share: the static page files, security headers, request checks.

The page is a fixed set of files shipped in the package (``static/``); the route serving them
looks a name up in that set and serves nothing else, so no path a request makes up can reach
another file. Every reply carries a Content-Security-Policy that lets the page run only its
own scripts: even a string that escaped escaping could not run. Requests must name this
server in ``Host`` (a web page elsewhere cannot reach a loopback viewer through DNS
rebinding), and a request that changes something must be JSON (a form on another site cannot
send it without a CORS preflight, which is refused).

Example:
    >>> app = page_app("my page", page="index.html", scrubber=Scrubber(), bind_host="127.0.0.1")  # doctest: +SKIP
    >>> @app.get("/api/thing")                                                                     # doctest: +SKIP
    ... def thing(): return json_reply({"any": "parsed JSON"}, Scrubber())
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from nemo_gym_env.errors import PageRequestError
from nemo_gym_env.system.hosts import HostPolicy
from nemo_gym_env.system.net import is_loopback
from nemo_gym_env.viewer.rows import Scrubber

__all__ = ["STATIC_FILES", "json_reply", "page_app", "protect", "serve_static"]

STATIC_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "play.html": "text/html; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "play.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
"""The page's files (in ``nemo_gym_env/viewer/static``) and their media types: the only files served."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body the apps read (a played turn is small)."""


def json_reply(content: Any, scrubber: Scrubber) -> JSONResponse:
    """A JSON reply of parsed JSON from a file or a server, made safe by ``scrubber`` on its way out."""
    return JSONResponse(scrubber.value(content))


def page_app(title: str, *, page: str, scrubber: Scrubber, bind_host: str) -> FastAPI:
    """A FastAPI app serving ``page`` and its files, with every check of :func:`protect`."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    protect(app, bind_host=bind_host, scrub=scrubber.text)
    serve_static(app, page=page)
    return app


@lru_cache(maxsize=None)
def _static_bytes(name: str) -> bytes:
    return importlib.resources.files("nemo_gym_env.viewer").joinpath("static", name).read_bytes()


def serve_static(app: FastAPI, *, page: str) -> None:
    """``GET /`` serves ``page``; ``GET /static/<name>`` serves a file of :data:`STATIC_FILES`, nothing else."""

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(_static_bytes(page), media_type=STATIC_FILES[page], headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC_FILES:
            raise PageRequestError(404, f"no such file: {name[:100]!r}")
        return Response(_static_bytes(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "no-store"})


def _content_length(request: Request) -> int:
    try:
        return int(request.headers.get("content-length") or 0)
    except ValueError:
        return MAX_BODY_BYTES + 1  # unreadable: refused like an oversized one


def protect(app: FastAPI, *, bind_host: str, scrub: Callable[[str], str]) -> None:
    """Security headers on every reply; Host, body size and JSON checks on every request; errors as JSON.

    ``scrub`` masks secrets in error messages (they may quote a server's reply).
    """
    # Bound to the network on purpose: any name may reach it; on loopback, only loopback names.
    policy = HostPolicy(bind_host, () if is_loopback(bind_host) else ("*",))

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not policy.host_ok(request.headers.get("host", "")):
            response: Response = JSONResponse({"error": "this server answers only to its loopback address"}, 421)
        elif request.method not in ("GET", "HEAD") and not request.headers.get("content-type", "").startswith(
                "application/json"):
            response = JSONResponse({"error": "send a JSON body (Content-Type: application/json)"}, 415)
        elif _content_length(request) > MAX_BODY_BYTES:
            response = JSONResponse({"error": f"the body is over {MAX_BODY_BYTES // 2**20} MiB"}, 413)
        else:
            response = await call_next(request)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    @app.exception_handler(PageRequestError)
    async def api_error(request: Request, exc: PageRequestError) -> JSONResponse:
        return JSONResponse({"error": scrub(exc.message)}, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("query", "body", "path"))
            problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
        return JSONResponse({"error": scrub("; ".join(problems) or "invalid request")}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)[:200]
        return JSONResponse({"error": scrub(detail)}, exc.status_code)
