"""Job lifecycle as the API sees it: create (validated, planned, enqueued), cancel, resume, delete, and the
public view of a job. The worker side (claim, run, finish) is in tasks.py.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import sqlalchemy as sa
from fastapi import HTTPException
from sqlmodel import Session, func, select

from slidedp_web import celery_app, live, planning
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session, write_session
from slidedp_web.guards import check_roots
from slidedp_web.job_schema import parse_config, split_body, unprocessable
from slidedp_web.journal import set_status, status_event
from slidedp_web.models import (
    RESUMABLE_STATUSES,
    TERMINAL_STATUSES,
    CheckpointPublic,
    Event,
    Job,
    JobPublic,
    LogLine,
    Metric,
    StatusChange,
    as_utc,
    iso,
    utcnow,
)

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- public view
def public(job: Job) -> JobPublic:
    metrics = job.last_metrics or None
    tokens_per_s = metrics.get("tokens_per_s") if metrics else None
    eta = None
    if job.status == "running" and metrics and isinstance(metrics.get("step_time_s"), (int, float)):
        eta = max(0, job.steps - job.step) * float(metrics["step_time_s"])
    return JobPublic(
        id=job.id,
        name=job.name,
        status=job.status,
        config=job.config,
        host=job.host,
        policy=job.policy,
        created_at=iso(job.created_at),
        started_at=iso(job.started_at),
        finished_at=iso(job.finished_at),
        step=job.step,
        steps=job.steps,
        last_metrics=metrics,
        error=job.error,
        eta_s=eta,
        tokens_per_s=tokens_per_s,
        output_dir=job.output_dir,
        checkpoints=[c.name for c in list_checkpoints(job.output_dir)],
    )


def list_checkpoints(output_dir: str) -> list[CheckpointPublic]:
    """Checkpoints the runtime kept in output_dir/checkpoints, oldest first (the step is read from the name)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    items = []
    for entry in root.iterdir():
        if entry.name.startswith(".") or entry.name.endswith((".tmp", ".partial")):
            continue  # a checkpoint still being written (saved atomically by rename)
        digits = re.findall(r"\d+", entry.name)
        size = (
            entry.stat().st_size
            if entry.is_file()
            else sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        )
        items.append(
            CheckpointPublic(
                name=entry.name, step=int(digits[-1]) if digits else None, bytes=size, path=str(entry)
            )
        )
    return sorted(items, key=lambda c: (c.step is None, c.step or 0, c.name))


def get_or_404(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"job {job_id} does not exist")
    return job


# ---------------------------------------------------------------------------------------------- create
def _absolute_if_local(value: Any) -> Any:
    """A relative path that exists from the API's working directory is made absolute, so that a worker
    started elsewhere on the same machine reads the same file."""
    if (
        isinstance(value, str)
        and value
        and not os.path.isabs(value)
        and ":" not in value
        and os.path.exists(value)
    ):
        return os.path.abspath(value)
    return value


def create(settings: Settings, session: Session, body: Any) -> Job:
    raw, extra = split_body(body)
    check_roots(settings, raw)  # before anything reads the paths it names
    host = planning.choose_host(session, settings, extra.get("host"))
    cfg = parse_config(raw, host_ram_bytes=planning.host_ram_bytes(host))
    live.require(settings, "job creation")
    queued = session.exec(select(func.count()).select_from(Job).where(Job.status == "queued")).one()
    if queued >= settings.max_queued_jobs:
        raise HTTPException(
            429,
            f"{queued} jobs are already queued (SLIDEDP_MAX_QUEUED_JOBS = "
            f"{settings.max_queued_jobs}); wait for some to run or cancel them",
        )
    try:
        plan = planning.summary(planning.plan_preview(cfg, host, settings))
    except Exception as exc:  # noqa: BLE001 - a planner bug must not stop a valid job; the worker plans again
        log.warning("plan preview failed: %s", exc)
        plan = None
    if host is not None and plan and plan.get("feasible") is False and plan.get("errors"):
        # The target host reported what it has, and the job cannot run there (too many GPUs, too little memory).
        raise unprocessable(plan["errors"])
    config = cfg.to_dict()
    config["data"]["path"] = _absolute_if_local(config["data"]["path"])
    config["model"] = _absolute_if_local(config["model"])
    queue = host.queue if host else settings.queue
    with write_session(settings) as ws:
        job = Job(
            name=extra.get("name"),
            status="queued",
            config=config,
            queue=queue,
            policy=plan,
            created_at=utcnow(),
            steps=cfg.steps,
            output_dir="",
        )
        ws.add(job)
        ws.flush()
        if "output_dir" in raw:
            out = Path(cfg.output_dir)
            job.output_dir = str(out if out.is_absolute() else (settings.data_dir / out).resolve())
        else:
            job.output_dir = str(settings.jobs_dir / str(job.id))
        job.config = {**config, "output_dir": job.output_dir}
        event = status_event(ws, job, "queued", message="created")
    try:
        celery_app.enqueue(settings, job.id, job.attempt, job.queue)
    except Exception as exc:  # noqa: BLE001 - the broker went away between the check and the send
        _delete_rows(settings, job.id)
        log.warning("enqueue of job %s failed: %s", job.id, exc)
        raise live.unavailable(settings, "job creation") from exc
    live.publish(settings, job.id, event)
    return job


# ------------------------------------------------------------------------------------- cancel / resume
def cancel(settings: Settings, job_id: int, save: bool) -> Job:
    live.require(settings, "cancel")
    with write_session(settings) as ws:
        job = ws.get(Job, job_id, with_for_update=True)
        if job is None:
            raise HTTPException(404, f"job {job_id} does not exist")
        event = None
        if job.status == "queued":
            # Not started: its queue message is dropped when a worker tries to claim it.
            job.finished_at = utcnow()
            event = status_event(ws, job, "cancelled", message="cancelled while queued")
        elif job.status == "running":
            job.cancel_request, job.cancel_requested_at = ("save" if save else "stop"), utcnow()
            ws.add(job)
        else:
            raise HTTPException(
                409, f"job {job_id} is {job.status}: only queued or running jobs can be cancelled"
            )
    if event:
        live.publish(settings, job_id, event)
    return job


def resume(settings: Settings, job_id: int) -> Job:
    live.require(settings, "resume")
    with write_session(settings) as ws:
        job = ws.get(Job, job_id, with_for_update=True)
        if job is None:
            raise HTTPException(404, f"job {job_id} does not exist")
        if job.status not in RESUMABLE_STATUSES:
            raise HTTPException(
                409, f"job {job_id} is {job.status}: only {', '.join(RESUMABLE_STATUSES)} jobs can be resumed"
            )
        job.attempt += 1
        job.error, job.finished_at, job.cancel_request, job.heartbeat_at = None, None, None, None
        event = status_event(ws, job, "queued", message=f"resumed (attempt {job.attempt})")
    try:
        celery_app.enqueue(settings, job.id, job.attempt, job.queue)
    except Exception as exc:  # noqa: BLE001
        # Left queued: the watchdog sends it again when Redis is back.
        log.warning("enqueue of resumed job %s failed: %s", job.id, exc)
    live.publish(settings, job_id, event)
    return job


# ---------------------------------------------------------------------------------------------- delete
def delete(settings: Settings, job_id: int) -> None:
    with read_session(settings) as session:
        job = get_or_404(session, job_id)
    if job.status == "running":
        raise HTTPException(409, f"job {job_id} is running: cancel it first, then delete it")
    _delete_rows(settings, job_id)
    _delete_outputs(settings, job.output_dir)


def _delete_rows(settings: Settings, job_id: int) -> None:
    with write_session(settings) as ws:
        for table in (Event, Metric, LogLine, StatusChange):
            ws.execute(sa.delete(table).where(table.job_id == job_id))
        ws.execute(sa.delete(Job).where(Job.id == job_id))


def _delete_outputs(settings: Settings, output_dir: str) -> None:
    """The whole directory when the workbench owns it (under the data directory); elsewhere only what a job
    writes there, so a user's output_dir pointing at a shared folder loses nothing else."""
    out = Path(output_dir)
    if not out.exists():
        return
    data = settings.data_dir.resolve()
    if out.resolve().is_relative_to(data) and out.resolve() != data:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in ("metrics.jsonl", "checkpoints", "final", "plan.json", "topology.json"):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
    try:
        out.rmdir()
    except OSError:
        pass


# ------------------------------------------------------------------------------------ recovery sweeps
def interrupt_stale(settings: Settings, host_name: Optional[str] = None) -> list[int]:
    """Mark interrupted the running jobs whose heartbeat stopped (or, with host_name, all running jobs of that
    host: its worker just started, so none of them is alive)."""
    cutoff = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)

    def stale(job: Job) -> bool:
        beat = as_utc(job.heartbeat_at)
        return host_name is not None or beat is None or beat < cutoff

    with read_session(settings) as session:
        query = select(Job).where(Job.status == "running")
        if host_name is not None:
            query = query.where(Job.host == host_name)
        running = [job for job in session.exec(query).all() if stale(job)]
    done = []
    for job in running:
        if host_name is not None:
            why = f"the worker on {host_name} restarted while the job ran"
        else:
            why = f"the worker on {job.host} stopped reporting (last heartbeat {iso(job.heartbeat_at) or 'never'})"
        error = {"message": why + "; resume the job to continue from its last checkpoint", "errors": []}
        # Checked again under the write lock: a heartbeat that arrived meanwhile keeps the job running.
        if set_status(
            settings,
            job.id,
            "interrupted",
            only_from=("running",),
            attempt=job.attempt,
            error=error,
            message=why,
            check=stale,
            finished_at=utcnow(),
            heartbeat_at=None,
        ):
            done.append(job.id)
    return done


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES
