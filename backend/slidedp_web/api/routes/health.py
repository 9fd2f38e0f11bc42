from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from slidedp_web import live
from slidedp_web.api.deps import SettingsDep
from slidedp_web.core.db import ping, read_session
from slidedp_web.hosts import online_hosts
from slidedp_web.models import Health

router = APIRouter(prefix="/health", tags=["health"])


def _check(settings) -> Health:
    database = ping(settings)
    redis_ok = live.reachable(settings)
    workers = 0
    if database:
        with read_session(settings) as session:
            workers = len(online_hosts(session, settings))
    return Health(
        status="ok" if database and redis_ok else "degraded",
        database=database,
        redis=redis_ok,
        workers=workers,
    )


@router.get("", response_model=Health)
async def health(settings: SettingsDep) -> Health:
    """Database and Redis reachable, and how many worker hosts reported recently."""
    return await run_in_threadpool(_check, settings)
