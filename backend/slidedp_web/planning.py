"""Plan preview in the API: the AutoPolicy dry run for a job on a given host, from that host's report.

No training and no torch: slidedp.planning.autopolicy.plan_job is fed the topology and calibration the
host's worker reported. Until that planner is present, the preview is the configured policy and the host
memory fit, labelled as such.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from fastapi.exceptions import RequestValidationError
from slidedp.config import JobConfig
from sqlmodel import Session, func, select

from slidedp_web import hosts
from slidedp_web.core.config import Settings
from slidedp_web.hosts import basic_topology, is_online, local_calibration
from slidedp_web.journal import clean_json
from slidedp_web.models import Host, Job

log = logging.getLogger(__name__)
GIB = 2**30


def choose_host(session: Session, settings: Settings, requested: Optional[str]) -> Optional[Host]:
    """The named host (422 if unknown), else the online host with the fewest queued and running jobs,
    else None: the job goes to this deployment's default queue and waits for its worker."""
    hosts = session.exec(select(Host).order_by(Host.name)).all()
    if requested:
        for host in hosts:
            if host.name == requested:
                return host
        known = ", ".join(h.name for h in hosts) or "none has reported yet"
        raise RequestValidationError(
            [
                {
                    "loc": ["body", "host"],
                    "type": "value_error",
                    "msg": f"unknown worker host {requested!r}; hosts: {known}",
                }
            ]
        )
    online = [h for h in hosts if is_online(settings, h)]
    if not online:
        return None

    def load(host: Host) -> int:
        return session.exec(
            select(func.count())
            .select_from(Job)
            .where(Job.queue == host.queue, Job.status.in_(("queued", "running")))
        ).one()

    return min(online, key=load)


def host_ram_bytes(host: Optional[Host]) -> Optional[int]:
    """The target host's RAM as its worker reported it (None: this machine's own limit applies)."""
    return hosts.host_ram_bytes(host.topology) if host is not None else None


def job_shape(cfg: JobConfig) -> dict[str, Any]:
    """The shape a calibration was measured at (slidedp.planning.calibration's header "shape")."""
    from slidedp.planning.shape import calibration_shape
    from slidedp.presets import model_config_dict

    return calibration_shape(cfg, model_config_dict(cfg.model))


def pick_calibration(cfg: JobConfig, report: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The host's calibration measured at this job's shape, world size and device (full before quick, then the
    newest); None when the host has none, and the plan is a memory fit only."""
    if not report:
        return None
    entries = report.get("entries") if "entries" in report else [report]
    try:
        shape = job_shape(cfg)
    except (OSError, KeyError, ValueError):
        return None
    device = "cuda" if cfg.gpus > 0 else "cpu"
    matches = [
        e
        for e in entries or []
        if isinstance(e, dict)
        and e.get("shape") == shape
        and e.get("world") == cfg.world_size
        and e.get("device") == device
    ]
    if not matches:
        return None
    return max(matches, key=lambda e: (not e.get("quick"), str(e.get("created_at", ""))))


def plan_preview(cfg: JobConfig, host: Optional[Host], settings: Settings) -> dict[str, Any]:
    topology = host.topology if host and host.topology else basic_topology(settings)
    calibration = pick_calibration(cfg, host.calibration if host else local_calibration(settings))
    try:
        from slidedp.planning.autopolicy import plan_job
    except ImportError:
        plan_job = None
    if plan_job is not None:
        plan = clean_json(plan_job(cfg, topology, calibration))
        if isinstance(plan, dict):
            plan.setdefault("host", host.name if host else settings.host_name)
        return plan
    return configured_plan(cfg, topology, host.name if host else settings.host_name)


def configured_plan(cfg: JobConfig, topology: dict[str, Any], host_name: str) -> dict[str, Any]:
    """The configured policy and whether the host state fits the host's RAM (no AutoPolicy)."""
    from slidedp.presets import model_config_dict, param_count

    fit: dict[str, Any] = {"note": "host state = parameters x 14 B (fp32 master + AdamW m, v + bf16 copy)"}
    try:
        params = param_count(model_config_dict(cfg.model))
        ram = hosts.host_ram_bytes(topology)
        need = params * 14
        fit.update(
            params=params, host_state_bytes=need, host_ram_bytes=ram, fits=None if not ram else need <= ram
        )
    except (OSError, KeyError, ValueError) as exc:
        fit.update(error=f"cannot size the model: {exc}")
    return {
        "source": "configured policy and memory fit (AutoPolicy unavailable)",
        "host": host_name,
        "policy": dataclasses.asdict(cfg.policy),
        "memory": fit,
        "candidates": [],
        "why": "AutoPolicy is not available in this installation: the job runs with its configured policy.",
    }


def summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What a job keeps of its plan: the plan itself (it is small) marked as the preview made at creation."""
    return {**plan, "stage": "planned"}
