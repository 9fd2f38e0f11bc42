"""Job lifecycle as the API sees it: create (validated, planned, enqueued), cancel, resume, delete, and the
public view of a job. The worker side (claim, run, finish) is in tasks.py.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import sqlalchemy as sa
from slidedp.config import JobConfig
from slidedp.planning import profiles
from slidedp.validation import JobCheck, check_config, checkpoint_model_problem
from sqlmodel import Session, func, select

from slidedp_web import celery_app, folder_lock, generations, hosts, live, outputs, planning
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session, write_session
from slidedp_web.errors import Conflict, NotFound, TooMany
from slidedp_web.guards import root_errors
from slidedp_web.job_schema import split_body, unprocessable
from slidedp_web.journal import set_status, status_event
from slidedp_web.models import (
    RESUMABLE_STATUSES,
    TERMINAL_STATUSES,
    Event,
    Generation,
    Host,
    JobPublic,
    JobRecord,
    LogLine,
    Metric,
    StatusChange,
    as_utc,
    iso,
    utcnow,
)
from slidedp_web.outputs import list_checkpoints

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- public view
def public(job: JobRecord) -> JobPublic:
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
        policy=planning.job_policy(job.plan),
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
        warnings=list(job.warnings or []),
        stage=job.stage,
        # A cancel asked of the running attempt and not yet done (cleared when the attempt ends).
        cancel_request=job.cancel_request if job.status == "running" and job.cancel_request else None,
        cancel_requested_at=(
            iso(job.cancel_requested_at) if job.status == "running" and job.cancel_request else None
        ),
    )


def get_or_404(session: Session, job_id: int) -> JobRecord:
    job = session.get(JobRecord, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
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


@dataclass
class RequestCheck:
    """What check_request found in a job request (POST /api/jobs, POST /api/plan)."""

    raw: dict[str, Any]  # the config keys
    extra: dict[str, Any]  # name, host
    host: Optional[Host]
    config: Optional[JobConfig]  # None: the config keys did not parse
    errors: list[dict[str, Any]] = field(default_factory=list)  # every problem, [{"loc", "msg"}]
    validation: list[dict[str, Any]] = field(default_factory=list)  # the runtime's findings (validate_job)
    plannable: bool = False  # a plan can be previewed: the config parsed, and its host, limits and model are usable
    plan: Optional[dict[str, Any]] = None  # the plan preview on the host (None: not made)
    plan_failure: Optional[str] = None  # why the planner failed, when it did
    init_from_job: Optional[int] = None  # the job whose checkpoint init_from names
    folder: Optional[Path] = None  # the requested output_dir, resolved (None: the job's own default folder)


def check_request(
    settings: Settings, session: Session, body: Any, declared: Optional[planning.DeclaredHost] = None
) -> RequestCheck:
    """Every problem with a job request in one answer, as a job creation would refuse it: paths outside the
    allowed folders (never read), an unknown host, the config keys and the runtime's checks of those that parsed
    (slidedp.validation.check_config: model, dataset, host RAM, init_from), the host's limits (cores, CPU ranks,
    host RAM, GPUs) for the keys that parsed, the init_from job, room in the output folder, and AutoPolicy's
    refusal on a host that has reported. A body that is not an object, or holds text no database can store, is
    refused alone (split_body). With `declared` (POST /api/plan's profile) the job is checked against that declared
    host instead of a reported one."""
    raw, extra = split_body(body)
    errors: list[dict[str, Any]] = root_errors(
        settings.model_roots, settings.data_roots, raw, settings.output_roots, settings.data_dir
    )
    refused = [str(e["loc"]) for e in errors]
    if declared is not None:
        host, host_error = declared, None
    else:
        host, host_error = planning.find_host(session, settings, extra.get("host"))
    if host_error is not None:
        errors.append(host_error)
    check = check_config(
        raw, planning.host_ram_bytes(host), refused=refused, host_ram=host_error is None
    )
    cfg = check.config
    out = RequestCheck(raw, extra, host, cfg, validation=[] if cfg is None else list(check.errors))
    errors += check.errors
    if declared is not None and cfg is not None:  # host RAM is judged below, as for any host
        errors += [e for e in profiles.job_errors(cfg, declared.profile) if e["loc"] == "gpus"]
    limits = host_limit_errors(settings, check, host) if host_error is None else []
    errors += limits
    model_usable = check.known("model") and not any(
        e["loc"] in ("model", "seq_len") for e in check.errors
    )
    out.plannable = cfg is not None and not refused and host_error is None and not limits and model_usable
    if check.parsed is not None and check.known("init_from"):
        out.init_from_job, found = init_from_errors(session, check.parsed, check.known("model"))
        errors += found
    if check.parsed is not None and check.known("output_dir") and host_error is None:
        if "output_dir" in raw:
            out.folder = outputs.resolve(settings, check.parsed.output_dir)
        room = room_error(out.folder or real_jobs_dir(settings), cfg if model_usable else None)
        if room:
            errors.append(room)
    if cfg is not None and model_usable and host_error is None:
        try:  # past SLIDEDP_PLAN_TIMEOUT_S, or with the server stopping, planning answers 503 (raised through)
            out.plan = planning.plan_preview(cfg, host, settings)
        except RuntimeError as exc:  # the planner failed in its process: kept on the job (unplanned), not hidden
            log.warning("plan preview failed: %s", exc)
            out.plan_failure = str(exc)
        if host is not None and out.plan and out.plan.get("feasible") is False:
            # The target host reported what it has, and the job cannot run there (too many GPUs, too little
            # memory); a key already reported keeps its first answer.
            said = {str(e["loc"]) for e in errors}
            errors += [e for e in out.plan.get("errors") or [] if str(e.get("loc")) not in said]
    elif host is not None and check.known("gpus") and check.parsed is not None:
        gpus = gpu_count_error(settings, check.parsed.gpus, host)
        if gpus:
            errors.append(gpus)
    out.errors = _once(errors)
    return out


def _once(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each {"loc", "msg"} once, in the order found."""
    seen, out = set(), []
    for e in errors:
        key = (str(e.get("loc")), str(e.get("msg")))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def create(settings: Settings, session: Session, body: Any) -> JobRecord:
    checked = check_request(settings, session, body)
    imported = hosts.imported_host_error(checked.host)  # planned for, but no worker there runs a job
    if checked.errors or imported:
        raise unprocessable(checked.errors + ([imported] if imported else []))
    extra, host, cfg, folder = checked.extra, checked.host, checked.config, checked.folder
    assert cfg is not None
    source = checked.init_from_job
    if folder is not None:
        reserved = outputs.reserved_error(settings, folder, None)
        if reserved:
            raise outputs.conflict("output_dir", reserved)
        if folder.is_dir() and outputs.read_marker(folder) is None and any(folder.iterdir()):
            raise outputs.conflict(
                "output_dir",
                f"{str(folder)!r} already holds files no job of this workbench wrote; name an empty or new folder "
                "(resume continues a job in its own folder; init_from starts from another job's checkpoint)",
            )
    live.require(settings, "job creation")
    queued = session.exec(select(func.count()).select_from(JobRecord).where(JobRecord.status == "queued")).one()
    if queued >= settings.max_queued_jobs:
        raise TooMany(
            f"{queued} jobs are already queued (SLIDEDP_MAX_QUEUED_JOBS = "
            f"{settings.max_queued_jobs}); wait for some to run or cancel them",
        )
    plan = planning.summary(checked.plan) if checked.plan else planning.unplanned(checked.plan_failure)
    config = cfg.to_dict()
    config["data"]["path"] = _absolute_if_local(config["data"]["path"])
    if config.get("eval", {}).get("path"):
        config["eval"]["path"] = _absolute_if_local(config["eval"]["path"])
    config["model"] = _absolute_if_local(config["model"])
    queue = host.queue if host else settings.queue
    with write_session(settings) as ws:
        # The folder check and the insert are one transaction under the write lock: of two requests naming one
        # folder, the second sees the first's row.
        outputs.lock_jobs(ws)
        job = JobRecord(
            name=extra.get("name"),
            status="queued",
            config=config,
            queue=queue,
            plan=plan,
            created_at=utcnow(),
            steps=cfg.steps,
            output_dir="",
            owner_token=secrets.token_hex(16),
            outputs={"claimed": False},
            init_from_job=source,
        )
        ws.add(job)
        ws.flush()
        target = folder or outputs.default_folder(settings, job.id)
        owner = outputs.owner_of(target, outputs.recorded_folders(ws), job.id)
        if owner is not None:
            ws.rollback()
            raise outputs.conflict("output_dir", outputs.conflict_message(target, owner), owner[0])
        job.output_dir = str(target)
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


def real_jobs_dir(settings: Settings) -> Path:
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    return outputs.real(settings.jobs_dir)


def host_cores(settings: Settings, host: Any) -> int:
    """Cores of the job's target host as its worker reported them (this machine's when none has)."""
    topology = host.topology if host is not None and host.topology else planning.basic_topology(settings)
    cpu = topology.get("cpu") if isinstance(topology, dict) else None
    cpu = cpu if isinstance(cpu, dict) else {}
    for key in ("cores", "logical_cores", "logical_cpus"):
        if isinstance(cpu.get(key), int) and cpu[key] > 0:
            return int(cpu[key])
    return os.cpu_count() or 1


def host_limit_errors(settings: Settings, check: JobCheck, host: Any) -> list[dict[str, str]]:
    """Limits that depend on the target host, for the keys that parsed: threads and CPU ranks by its cores, host
    RAM by its limit."""
    from slidedp_web.guards import host_ram_error

    cfg = check.parsed
    if cfg is None:
        return []
    cores = host_cores(settings, host)
    where = f"host {host.name}" if host is not None else "this host"
    errors = []
    if check.known("cpu_threads") and cfg.cpu_threads is not None and cfg.cpu_threads > cores:
        errors.append(
            {
                "loc": "cpu_threads",
                "msg": f"must be at most {cores}, the cores of {where}; leave it out "
                "to split the cores over the ranks",
            }
        )
    if check.known("gpus", "ranks") and cfg.gpus == 0 and cfg.ranks > 4 * cores:
        errors.append(
            {
                "loc": "ranks",
                "msg": f"must be at most {4 * cores} (4 x the {cores} cores of {where}): "
                "CPU ranks are for development and tests",
            }
        )
    detected = planning.host_ram_bytes(host)
    if detected is None:
        detected = hosts_ram_here(settings)
    raised = host_ram_error(cfg, detected) if check.known("host_ram_gib") else None
    if raised:
        errors.append(raised)
    return errors


def gpu_count_error(settings: Settings, gpus: int, host: Host) -> Optional[dict[str, str]]:
    """More GPUs than the reported host has, said as AutoPolicy says it (for a config it cannot plan)."""
    topology = host.topology if host.topology else planning.basic_topology(settings)
    n = len(topology.get("gpus") or []) if isinstance(topology, dict) else 0
    if gpus <= n:
        return None
    return {
        "loc": "gpus",
        "msg": f"asks for {gpus} GPUs but this host has {n}; set gpus to at most {n} (0 trains on the CPU)",
    }


def hosts_ram_here(settings: Settings) -> Optional[int]:
    from slidedp_web.hosts import host_ram_bytes

    return host_ram_bytes(planning.basic_topology(settings))


def room_error(folder: Path, cfg: Any) -> Optional[dict[str, str]]:
    """{"loc": "output_dir", ...} when the job could not write its checkpoints and export there (cfg None: only
    whether it can write there at all)."""
    need = None
    if cfg is not None:
        try:
            need = outputs.needed_bytes(cfg)
        except (OSError, KeyError, ValueError, TypeError):
            need = None  # a model that cannot be sized was reported by validation already
    msg = outputs.writable_error(folder, need)
    return {"loc": "output_dir", "msg": msg} if msg else None


def init_from_errors(
    session: Session, cfg: Any, same_model: bool = False
) -> tuple[Optional[int], list[dict[str, str]]]:
    """(the id of the job whose checkpoint init_from names, []), or (None, [why not]). The API takes a job and a
    checkpoint name; a checkpoint path is for the command line, where the user owns the files. same_model: the
    checkpoint must also hold cfg's model shape, as the run would refuse it otherwise."""
    source = getattr(cfg, "init_from", None)
    if source is None:
        return None, []
    if source.job is None:
        return None, [
            {
                "loc": "init_from.job",
                "msg": "name the job to start from: init_from: {job: ID, "
                "checkpoint: NAME or latest}; the API does not take checkpoint paths",
            }
        ]
    other = session.get(JobRecord, source.job)
    if other is None:
        return None, [{"loc": "init_from.job", "msg": f"job {source.job} does not exist"}]
    names = [c.name for c in list_checkpoints(other.output_dir) if c.step is not None]
    if not names:
        return None, [
            {
                "loc": "init_from.checkpoint",
                "msg": f"job {source.job} has no checkpoint (it keeps them with checkpoint.interval > 0)",
            }
        ]
    if source.checkpoint != "latest" and source.checkpoint not in names:
        return None, [
            {
                "loc": "init_from.checkpoint",
                "msg": f"job {source.job} has no checkpoint "
                f"{source.checkpoint!r}; it has: {', '.join(names)} (or say latest)",
            }
        ]
    name = names[-1] if source.checkpoint == "latest" else source.checkpoint
    problem = checkpoint_model_problem(checkpoint_path(session, source.job, name), cfg) if same_model else None
    if problem:
        return None, [{"loc": "init_from.job", "msg": f"checkpoint {name} of job {source.job} {problem}"}]
    return int(source.job), []


def checkpoint_path(session: Session, job_id: int, name: str) -> str:
    """The directory of a job's checkpoint by name ('latest': its newest complete one)."""
    other = session.get(JobRecord, job_id)
    if other is None:
        raise FileNotFoundError(f"job {job_id}, whose checkpoint this job starts from, was deleted")
    found = [c for c in list_checkpoints(other.output_dir) if c.step is not None]
    if name == "latest" and found:
        return found[-1].path
    for c in found:
        if c.name == name:
            return c.path
    raise FileNotFoundError(f"job {job_id} no longer has checkpoint {name!r}")


# ------------------------------------------------------------------------------------- cancel / resume
def cancel(settings: Settings, job_id: int, save: bool) -> JobRecord:
    live.require(settings, "cancel")
    with write_session(settings) as ws:
        job = ws.get(JobRecord, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        event = None
        if job.status == "queued":
            # Not started: its queue message is dropped when a worker tries to claim it.
            job.finished_at = utcnow()
            event = status_event(ws, job, "cancelled", message="cancelled while queued")
        elif job.status == "running":
            job.cancel_request, job.cancel_requested_at = ("save" if save else "stop"), utcnow()
            ws.add(job)
        else:
            raise Conflict(
                f"job {job_id} is {job.status}: only queued or running jobs can be cancelled"
            )
    if event:
        live.publish(settings, job_id, event)
    return job


def resume(settings: Settings, job_id: int) -> JobRecord:
    live.require(settings, "resume")
    with write_session(settings) as ws:
        job = ws.get(JobRecord, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.status not in RESUMABLE_STATUSES:
            raise Conflict(
                f"job {job_id} is {job.status}: only {', '.join(RESUMABLE_STATUSES)} jobs can be resumed"
            )
        event = _new_attempt(ws, job, "train", "resumed")
    _send(settings, job, event)
    return job


def _new_attempt(ws: Session, job: JobRecord, action: str, what: str) -> dict[str, Any]:
    """Queue the job again as a new attempt whose action is `action`; the status event it records."""
    job.attempt += 1
    job.action = action
    job.error, job.finished_at, job.cancel_request, job.heartbeat_at = None, None, None, None
    job.stage = None  # the new attempt reports its own start-up
    return status_event(ws, job, "queued", message=f"{what} (attempt {job.attempt})")


def _send(settings: Settings, job: JobRecord, event: dict[str, Any]) -> None:
    try:
        celery_app.enqueue(settings, job.id, job.attempt, job.queue)
    except Exception as exc:  # noqa: BLE001 - left queued: the watchdog sends it again when Redis is back
        log.warning("enqueue of job %s attempt %s failed: %s", job.id, job.attempt, exc)
    live.publish(settings, job.id, event)


def request_export(settings: Settings, job_id: int) -> JobRecord:
    """Queue an export of the job's last step from its newest checkpoint: a retry after an export failed (a full
    disk), or a new final/ after the old one was removed. It runs on the job's host, behind a running job."""
    live.require(settings, "export")
    with write_session(settings) as ws:
        job = ws.get(JobRecord, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.status in ("queued", "running"):
            raise Conflict(f"job {job_id} is {job.status}: export it once it has ended")
        found = list_checkpoints(job.output_dir)
        if not found or found[-1].step != job.steps:
            newest = f"its newest checkpoint is {found[-1].name}" if found else "it has no checkpoint"
            raise Conflict(
                f"job {job_id} cannot be exported: {newest}, and an export needs the state of its last step "
                f"({job.steps}); resume the job to train to the end (it exports when it completes)",
            )
        event = _new_attempt(ws, job, "export", f"export of {found[-1].name}")
    _send(settings, job, event)
    return job


# ---------------------------------------------------------------------------------------------- delete
def delete(settings: Settings, job_id: int) -> None:
    with read_session(settings) as session:
        job = get_or_404(session, job_id)
        users = session.exec(
            select(JobRecord.id).where(JobRecord.init_from_job == job_id, JobRecord.status.in_(("queued", "running")))
        ).all()
    if job.status == "running":
        raise Conflict(f"job {job_id} is running: cancel it first, then delete it")
    if users:
        raise Conflict(
            f"job {job_id}'s checkpoint is where job(s) {', '.join(map(str, users))} start from (init_from), and "
            "they have not started yet: delete it once they run, or cancel them first",
        )
    _delete_rows(settings, job_id)
    _delete_outputs(settings, job)


def _delete_rows(settings: Settings, job_id: int) -> None:
    with write_session(settings) as ws:
        generations.refuse_delete_while_running(ws, job_id)
        for table in (Event, Metric, LogLine, StatusChange, Generation):
            ws.execute(sa.delete(table).where(table.job_id == job_id))
        ws.execute(sa.delete(JobRecord).where(JobRecord.id == job_id))


def _delete_outputs(settings: Settings, job: JobRecord) -> list[str]:
    """What the job wrote in its folder, nothing else (slidedp_web/outputs.py); its rows are gone already, so
    every folder still recorded belongs to another job and is left alone."""
    if not job.output_dir:
        return []
    folder = Path(job.output_dir)
    recorded = job.outputs
    if job.owner_token is None and outputs.real(folder) == outputs.default_folder(settings, job.id):
        recorded = {
            "created_dirs": [str(folder)]
        }  # recorded before ownership: its default folder was its own
    with read_session(settings) as session:
        others = [d for _, d in outputs.recorded_folders(session)]
    try:
        return outputs.remove(folder, job.owner_token, recorded, others)
    except OSError as exc:
        log.warning("deleting the outputs of job %s in %s: %s", job.id, folder, exc)
        return []


# ------------------------------------------------------------------------------------ recovery sweeps
def interrupt_stale(settings: Settings, host_name: Optional[str] = None) -> list[int]:
    """Mark interrupted the running jobs whose heartbeat stopped (or, with host_name, all running jobs of that
    host: its worker just started, so none of them is alive)."""
    cutoff = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s)

    def stale(job: JobRecord) -> bool:
        beat = as_utc(job.heartbeat_at)
        if not (host_name is not None or beat is None or beat < cutoff):
            return False
        # A job process outlives a worker killed with SIGKILL: while it holds its folder's lock it is alive and
        # stopping, and reports its own end; marked now, a resume would start a second process in the folder.
        return not folder_lock.held(job.output_dir)

    with read_session(settings) as session:
        query = select(JobRecord).where(JobRecord.status == "running")
        if host_name is not None:
            query = query.where(JobRecord.host == host_name)
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
