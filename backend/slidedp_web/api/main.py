"""All API routes under /api, behind the bearer-token check (deps.require_token; tickets for the GETs a browser
cannot give a header to)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from slidedp_web.api.deps import require_token
from slidedp_web.api.routes import events, generations, health, hosts, jobs, plan, presets, profiles, tickets

api_router = APIRouter(prefix="/api", dependencies=[Depends(require_token)])
for module in (jobs, events, generations, hosts, plan, presets, profiles, health, tickets):
    api_router.include_router(module.router)
