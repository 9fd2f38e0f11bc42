from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from slidedp.planning import host_file
from slidedp.planning.shape import SCHEMA_VERSION
from sqlmodel import select

from slidedp_web.api.deps import SessionDep, SettingsDep
from slidedp_web.hosts import import_saved, is_online
from slidedp_web.models import Host, HostList, HostPublic, iso
from slidedp_web.planning import calibration_entries

router = APIRouter(prefix="/hosts", tags=["hosts"])


@router.get("", response_model=HostList)
def list_hosts(session: SessionDep, settings: SettingsDep) -> HostList:
    """Worker hosts with the topology and calibration they reported, and whether they are online."""
    hosts = session.exec(select(Host).order_by(Host.name)).all()
    return HostList(
        items=[
            HostPublic(
                name=h.name,
                queue=h.queue,
                topology=h.topology or {},
                calibration=readable_calibration(h.calibration),
                last_seen=iso(h.last_seen),
                online=is_online(settings, h),
            )
            for h in hosts
        ]
    )


def readable_calibration(report: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The host's calibration report with each record as the planner reads it (`shape_upgraded` or `outdated`,
    planning.calibration_entries) and `current_schema`, the schema this runtime writes."""
    if not isinstance(report, dict) or not isinstance(report.get("entries"), list):
        return report
    return {**report, "entries": calibration_entries(report), "current_schema": SCHEMA_VERSION}


@router.post("/import", status_code=201)
async def import_host(
    request: Request, settings: SettingsDep, file: str = Query("saved host", max_length=200)
) -> dict[str, Any]:
    """Import a saved host (the JSON `slidedp topology --save FILE` wrote, as the request body): listed as
    `imported:<name>`, planned for by POST /api/plan with that `host`, never given a job (it has no worker).
    `file` names the file it came from, for the page to say. A body over the size limit is a 413; one that is not
    a saved host a 422 saying what is wrong."""
    size, chunks = 0, []
    async for chunk in request.stream():  # counted as it arrives: an oversized body is never held whole
        size += len(chunk)
        if size > host_file.MAX_BYTES:
            raise HTTPException(413, f"too large for a saved host: at most {host_file.MAX_BYTES // 2**20} MiB")
        chunks.append(chunk)

    def refuse(msg: str) -> RequestValidationError:
        return RequestValidationError([{"loc": ["body"], "type": "value_error", "msg": msg}])

    try:
        saved = host_file.parse(json.loads(b"".join(chunks)))
    except ValueError as exc:  # HostFileError, or a body that is not JSON
        raise refuse(str(exc) if isinstance(exc, host_file.HostFileError) else
                     f"the body is not JSON ({exc}); send the file `slidedp topology --save FILE` wrote") from None
    try:
        name = import_saved(settings, saved, file)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    return {"name": name, "saved_at": saved.saved_at, "gpus": len(saved.topology["gpus"]),
            "calibrations": len(saved.calibrations)}
