from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter
from slidedp.planning.shape import SCHEMA_VERSION
from sqlmodel import select

from slidedp_web.api.deps import SessionDep, SettingsDep
from slidedp_web.hosts import is_online
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
