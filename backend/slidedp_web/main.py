"""The FastAPI app: the API under /api, OpenAPI at /openapi.json, the built UI (frontend/dist) at /.

uvicorn slidedp_web.main:app --host 127.0.0.1 --port 8000     (or: slidedp serve, which starts everything)
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
from starlette.concurrency import run_in_threadpool

import slidedp_web
from slidedp_web import logs, watchdog
from slidedp_web.api.main import api_router
from slidedp_web.api.routes import metrics
from slidedp_web.core.config import Settings, get_settings
from slidedp_web.core.db import upgrade
from slidedp_web.guards import RequestSizeLimit
from slidedp_web.job_schema import openapi_components

log = logging.getLogger(__name__)
REPO_FRONTEND = Path(slidedp_web.__file__).resolve().parents[2] / "frontend" / "dist"


def create_app(settings: Optional[Settings] = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if logs.log_format(settings.log_format) == "json":
            logs.configure("INFO", "json")  # after uvicorn set up its loggers, so theirs turn JSON too
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        await run_in_threadpool(upgrade, settings)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog.run, settings)
            yield
            tg.cancel_scope.cancel()

    app = FastAPI(
        title="SlideDP Workbench",
        version="0.1.0",
        description="Full-parameter fine-tuning of LLMs larger than GPU memory: jobs, live metrics, hosts, plans.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    if logs.log_format(settings.log_format) == "json":
        # `uvicorn slidedp_web.main:app` has set up its loggers by now: they turn JSON too.
        logs.configure("INFO", "json")
    app.add_middleware(RequestSizeLimit, max_bytes=settings.max_request_bytes)
    app.include_router(api_router)
    app.include_router(metrics.router)  # /metrics, where Prometheus looks by default
    _install_openapi(app)
    _mount_frontend(app, settings.frontend_dir or REPO_FRONTEND)
    return app


def _install_openapi(app: FastAPI) -> None:
    """The generated document plus the job request schema derived from slidedp.config.JobConfig."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


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
