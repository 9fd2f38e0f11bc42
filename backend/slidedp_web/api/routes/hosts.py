from __future__ import annotations

from fastapi import APIRouter
from sqlmodel import select

from slidedp_web.api.deps import SessionDep, SettingsDep
from slidedp_web.hosts import is_online
from slidedp_web.models import Host, HostList, HostPublic, iso

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
                calibration=h.calibration,
                last_seen=iso(h.last_seen),
                online=is_online(settings, h),
            )
            for h in hosts
        ]
    )
