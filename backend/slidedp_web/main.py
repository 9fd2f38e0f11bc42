"""The FastAPI app: the API under /api, OpenAPI at /openapi.json, the built UI at / (default_frontend says which).

uvicorn slidedp_web.main:app --host 127.0.0.1 --port 8000     (or: slidedp serve, which starts everything)

Run this way the app cannot know the address it was bound to: without SLIDEDP_API_TOKEN it answers loopback
connections only (require_token refuses the rest with 403) unless SLIDEDP_INSECURE=1. `slidedp serve --host H`
(`--api-only` for the API alone) decides for its bind instead, and generates a token for a non-loopback one.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Optional

import anyio
from fastapi import FastAPI, HTTPException
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from slidedp.version import __version__ as slidedp_version
from starlette.concurrency import run_in_threadpool

import slidedp_web
from slidedp_web import errors, logs, watchdog
from slidedp_web.api.main import api_router
from slidedp_web.api.middleware import RequestSizeLimit
from slidedp_web.api.routes import metrics, tickets
from slidedp_web.core.config import Settings, get_settings
from slidedp_web.core.db import upgrade
from slidedp_web.job_schema import openapi_components

log = logging.getLogger(__name__)
# The UI a wheel carries (setup.py copies frontend/dist there), and a source checkout's own build.
PACKAGED_FRONTEND = Path(slidedp_web.__file__).resolve().parent / "ui"
REPO_FRONTEND = Path(slidedp_web.__file__).resolve().parents[2] / "frontend" / "dist"


def default_frontend() -> Path:
    """The UI an installed wheel carries, else the source checkout's frontend/dist (an editable install)."""
    return PACKAGED_FRONTEND if (PACKAGED_FRONTEND / "index.html").is_file() else REPO_FRONTEND


def create_app(settings: Optional[Settings] = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if logs.log_format(settings.log_format) == "json":
            logs.configure("INFO", "json")  # after uvicorn set up its loggers, so theirs turn JSON too
        logs.install_redaction()  # on the handlers uvicorn has made by now
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        await run_in_threadpool(upgrade, settings)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog.run, settings)
            yield
            tg.cancel_scope.cancel()

    app = FastAPI(
        title="SlideDP Workbench",
        version=slidedp_version,
        description="Full-parameter fine-tuning of LLMs larger than GPU memory: jobs, live metrics, hosts, plans.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tickets = tickets.TicketStore(settings.ticket_ttl_s, settings.max_tickets)
    if logs.log_format(settings.log_format) == "json":
        # `uvicorn slidedp_web.main:app` has set up its loggers by now: they turn JSON too.
        logs.configure("INFO", "json")
    logs.install_redaction()
    app.add_middleware(RequestSizeLimit, max_bytes=settings.max_request_bytes)
    app.include_router(api_router)
    app.include_router(metrics.router)  # /metrics, where Prometheus looks by default
    _install_openapi(app)
    _clear_body_errors(app)
    _answer_refusals(app)
    _mount_frontend(app, settings.frontend_dir or default_frontend())
    return app


def _answer_refusals(app: FastAPI) -> None:
    """A service's refusal (slidedp_web.errors) answered with its status and {"detail": ...}, the body an
    HTTPException or a request validation error gives, so that clients see one shape whichever layer refused."""
    from fastapi.encoders import jsonable_encoder
    from fastapi.responses import JSONResponse

    @app.exception_handler(errors.Refused)
    async def _refused(request: Any, exc: errors.Refused) -> Any:
        return JSONResponse(status_code=exc.status, content={"detail": jsonable_encoder(exc.detail)})


UNREADABLE_BODY = "There was an error parsing the body"  # FastAPI's words for a body it cannot decode


def _clear_body_errors(app: FastAPI) -> None:
    """FastAPI answers a JSON body it cannot decode with a bare 400; say what is wrong and how to fix it: text
    that is not UTF-8 (400), or arrays and objects nested deeper than the parser goes (422, as any JSON the
    request cannot be made of)."""
    from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Any, exc: StarletteHTTPException) -> Any:
        if exc.status_code == 400 and exc.detail == UNREADABLE_BODY:
            if isinstance(exc.__cause__, RecursionError):
                too_deep = RequestValidationError([{
                    "loc": ["body"], "type": "json_invalid",
                    "msg": "the JSON nests too deeply to be read (arrays or objects inside one another, thousands of "
                    "levels down); a request body is a JSON object whose values nest a few levels at most",
                }])
                return await request_validation_exception_handler(request, too_deep)
            why = (
                "JSON must be UTF-8 encoded" if isinstance(exc.__cause__, UnicodeDecodeError)
                else f"it could not be decoded ({type(exc.__cause__).__name__})"
            )
            exc = StarletteHTTPException(
                400,
                f"the request body is not JSON text: {why}; send the job config as a JSON "
                "object with Content-Type: application/json",
            )
        return await http_exception_handler(request, exc)


def _install_openapi(app: FastAPI) -> None:
    """The generated document plus the job request schema derived from slidedp.config.JobConfig."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components())
            _document_tickets(schema)
            _document_errors(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


ERROR_SCHEMA = {
    "title": "HTTPError",
    "type": "object",
    "properties": {
        "detail": {
            "description": "What is wrong and what to do: a sentence, or (409, 422) one item per field, "
            "{loc: ['body', key...], msg, type}",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
        }
    },
    "required": ["detail"],
}
ERRORS = {
    400: "The body is not JSON text (JSON must be UTF-8 encoded)",
    401: "No or a wrong API token (when the server has one): send 'Authorization: Bearer <token>'",
    404: "No job with this id",
    409: "The job's state or its output folder does not allow this (the detail says why and what to do)",
    413: "The request body is larger than SLIDEDP_MAX_REQUEST_BYTES; nothing was read",
    422: "A bad field, named by its key path (malformed JSON is a 422 of type json_invalid)",
    429: "Too many jobs queued (SLIDEDP_MAX_QUEUED_JOBS)",
    503: "Redis is unreachable; nothing was changed",
}
CONFLICTS = {  # operations that answer 409
    ("post", "/api/jobs"), ("post", "/api/jobs/{job_id}/cancel"), ("post", "/api/jobs/{job_id}/resume"),
    ("delete", "/api/jobs/{job_id}"), ("post", "/api/jobs/{job_id}/export"), ("get", "/api/jobs/{job_id}/export"),
    ("post", "/api/jobs/{job_id}/generate"),
}
NEEDS_REDIS = {("post", "/api/jobs"), ("post", "/api/jobs/{job_id}/cancel"), ("post", "/api/jobs/{job_id}/resume"),
               ("post", "/api/jobs/{job_id}/export"), ("get", "/api/jobs/{job_id}/events"),
               ("post", "/api/jobs/{job_id}/generate")}


def _document_errors(schema: dict[str, Any]) -> None:
    """Every answer an /api operation can give besides its success, with the error body's shape."""
    schema["components"]["schemas"]["HTTPError"] = ERROR_SCHEMA
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPError"}}}
    for path, operations in schema.get("paths", {}).items():
        if not path.startswith("/api"):
            continue
        for method, op in operations.items():
            codes = {401}
            if "{job_id}" in path:
                codes.add(404)
            if op.get("requestBody"):
                codes.update((400, 413, 422))
            if op.get("parameters"):
                codes.add(422)
            if (method, path) in CONFLICTS:
                codes.add(409)
            if (method, path) in NEEDS_REDIS:
                codes.add(503)
            if (method, path) == ("post", "/api/jobs"):
                codes.add(429)
            answers = op.setdefault("responses", {})
            for code in sorted(codes):
                entry = answers.setdefault(str(code), {"description": ERRORS[code]})
                if code != 422:
                    entry.setdefault("content", body)


TICKET_PARAMETER = {
    "name": "ticket",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "Instead of the bearer header, for a client that cannot send one (a browser's EventSource, "
    "a download link): a ticket from POST /api/tickets for exactly this path, valid once within its lifetime. "
    "Only needed when the server has an API token.",
}


def _document_tickets(schema: dict[str, Any]) -> None:
    """The routes that accept ?ticket= say so (require_token checks it for every route, but tickets are issued
    only for these)."""
    for path in tickets.TICKET_ROUTES:
        operation = schema.get("paths", {}).get(path, {}).get("get")
        if operation is None:
            continue
        params = operation.setdefault("parameters", [])
        if not any(p.get("name") == "ticket" and p.get("in") == "query" for p in params):
            params.append(dict(TICKET_PARAMETER))
        operation.setdefault("responses", {}).setdefault(
            "401",
            {"description": "An API token is in force and neither the bearer header nor a valid ticket came"},
        )


def _mount_frontend(app: FastAPI, dist: Path) -> None:
    """Files of the built UI by path; any other non-API path gets index.html (the UI routes in the browser)."""

    @app.get("/{path:path}", include_in_schema=False)
    async def spa(path: str) -> FileResponse:
        if path == "api" or path.startswith("api/"):
            raise HTTPException(404, f"no API route /{path}")
        index = dist / "index.html"
        if not index.is_file():
            raise HTTPException(
                404,
                f"the UI is not built ({index} is missing): run scripts/build_frontend.sh, "
                "or use the API under /api (docs at /docs)",
            )
        target = (dist / path).resolve()
        if path and target.is_file() and target.is_relative_to(dist.resolve()):
            return FileResponse(target)
        return FileResponse(index, headers={"Cache-Control": "no-cache"})


app = create_app()
