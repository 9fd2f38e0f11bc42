"""The worker's task: claim a queued job, run it in a freshly spawned process, supervise it to the end.

The supervisor (this task, in the worker's process) writes the job's heartbeat, turns a cancel request
into the stop flag the job polls at each step boundary, kills the job's process group when it does not stop
within the grace period, and records the final status from the job's outcome.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any, Optional

import sqlalchemy as sa
from celery import shared_task
from celery.signals import worker_shutting_down

from slidedp_web import job_process, live, logs
from slidedp_web.celery_app import GENERATE_TASK, TASK_NAME
from slidedp_web.core.config import Settings, get_settings
from slidedp_web.core.db import read_session, write_session
from slidedp_web.hosts import report, set_current_job
from slidedp_web.journal import clean_json, record_log, status_event
from slidedp_web.models import Host, Job, utcnow

log = logging.getLogger(__name__)
STOP, SAVE = 1, 2


# Set while this worker supervises a job: a shutdown waits for it (see worker.bound_shutdown).
supervising = threading.Event()


@shared_task(name=TASK_NAME, ignore_result=True)
def run_job(job_id: int, attempt: int) -> Optional[str]:
    supervising.set()
    try:
        with logs.job_context(int(job_id)):
            return supervise(get_settings(), int(job_id), int(attempt))
    finally:
        supervising.clear()


@shared_task(name=GENERATE_TASK, ignore_result=True)
def run_generation(generation_id: int) -> Optional[str]:
    """A prompt for a job's model (generation_process.py): on the job's queue, so it runs between jobs."""
    from slidedp_web import generation_process

    supervising.set()
    try:
        return generation_process.supervise(get_settings(), int(generation_id))
    finally:
        supervising.clear()


def claim(settings: Settings, job_id: int, attempt: int) -> Optional[Job]:
    """queued -> running for exactly this attempt, atomically; None for a duplicate or stale message."""
    with write_session(settings) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.status != "queued" or job.attempt != attempt:
            return None
        now = utcnow()
        job.host, job.started_at, job.heartbeat_at = settings.host_name, now, now
        job.finished_at, job.error, job.cancel_request = None, None, None
        event = status_event(session, job, "running", message=f"attempt {attempt} on {settings.host_name}")
        set_current_job(session, settings.host_name, job_id)
    live.publish(settings, job_id, event)
    return job


def supervise(settings: Settings, job_id: int, attempt: int) -> str:
    job = claim(settings, job_id, attempt)
    if job is None:
        with read_session(settings) as session:
            current = session.get(Job, job_id)
        found = "deleted" if current is None else f"{current.status}, attempt {current.attempt}"
        log.warning(
            "job %s attempt %s not claimed (%s): duplicate or stale delivery ignored", job_id, attempt, found
        )
        return "ignored"
    log.info("job %s attempt %s: running", job_id, attempt)
    ctx = mp.get_context("spawn")
    stop = ctx.Value("i", 0)
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=job_process.run,
        args=(settings.env(), job_id, attempt, stop, sender),
        name=f"slidedp-job-{job_id}",
    )
    proc.start()
    sender.close()
    log.info("job %s attempt %s: job process %s", job_id, attempt, proc.pid)
    outcome: Optional[dict[str, Any]] = None
    reason: Optional[str] = None  # "cancel" | "shutdown": why the supervisor asked the job to stop
    kill_at: Optional[float] = None
    killed = False
    next_beat = next_check = 0.0
    while True:
        if outcome is None and receiver.poll(0.5):
            try:
                outcome = receiver.recv()
            except EOFError:
                pass
        elif outcome is not None:
            proc.join(0.5)  # it has reported: wait for its exit instead of spinning on a CPU it needs
        if not proc.is_alive():
            break
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 1.0
            request = _heartbeat(settings, job_id, attempt, write=now >= next_beat)
            if now >= next_beat:
                next_beat = now + settings.heartbeat_s
            if reason is None and request:
                reason, stop.value = "cancel", SAVE if request == "save" else STOP
                kill_at = now + settings.cancel_grace_s
                record_log(
                    settings,
                    job_id,
                    "cancel requested: stopping at the next step boundary"
                    + (" after saving a checkpoint" if request == "save" else ""),
                )
            elif reason is None and _worker_shutting_down():
                reason, stop.value, kill_at = "shutdown", SAVE, now + settings.cancel_grace_s
                record_log(
                    settings,
                    job_id,
                    "the worker is shutting down: stopping at the next step boundary "
                    "after saving a checkpoint",
                )
        if kill_at is not None and not killed and time.monotonic() > kill_at:
            record_log(
                settings, job_id, f"the job did not stop within {settings.cancel_grace_s:g} s: killing it"
            )
            _kill_group(proc.pid)
            killed = True
    proc.join()
    if outcome is None and receiver.poll(0.1):
        try:
            outcome = receiver.recv()
        except EOFError:
            pass
    receiver.close()
    _kill_group(proc.pid)  # rank processes left behind by a crashed job
    try:  # a job calibrates this host for its shape on its first run: report that now, not at the next report
        report(settings)
    except Exception as exc:  # noqa: BLE001 - the periodic report carries it anyway
        log.warning("host report after job %s failed: %s", job_id, exc)
    return _finish(settings, job_id, attempt, outcome, reason, killed, proc.exitcode)


def _heartbeat(settings: Settings, job_id: int, attempt: int, write: bool) -> Optional[str]:
    """Write the heartbeat (when due) and return the job's cancel request, if any."""
    if write:
        with write_session(settings) as session:
            session.execute(
                sa.update(Job).where(Job.id == job_id, Job.attempt == attempt).values(heartbeat_at=utcnow())
            )
    with read_session(settings) as session:
        row = session.execute(sa.select(Job.cancel_request).where(Job.id == job_id)).first()
    return row[0] if row else "stop"  # a deleted job stops


_shutting_down = threading.Event()


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    _shutting_down.set()


def _worker_shutting_down() -> bool:
    from celery.worker import state

    # The flags hold the exit code once set, and a clean exit is 0: compare with None/False, not truthiness.
    return _shutting_down.is_set() or any(
        flag not in (None, False) for flag in (state.should_stop, state.should_terminate)
    )


def _kill_group(pgid: Optional[int]) -> None:
    if not pgid:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.5)


def _finish(
    settings: Settings,
    job_id: int,
    attempt: int,
    outcome: Optional[dict],
    reason: Optional[str],
    killed: bool,
    exitcode: Optional[int],
) -> str:
    policy = clean_json(outcome.get("policy")) if outcome else None
    result = (outcome or {}).get("status")
    error: Optional[dict] = None
    if result == "completed":
        status = "completed"
    elif reason == "worker_gone":  # recorded by the job process itself (job_process._finish_orphaned)
        status = "interrupted"
        saved = (
            " at a step boundary, with a checkpoint"
            if result == "stopped" and (outcome or {}).get("steps_done")
            else ""
        )
        error = {
            "message": f"the worker on {settings.host_name} died during the job, which stopped on its own{saved}; "
            "resume it to continue from its last checkpoint",
            "errors": [],
        }
    elif reason == "shutdown":
        status = "interrupted"
        error = {
            "message": f"the worker on {settings.host_name} shut down during the job; resume it to continue "
            "from its last checkpoint",
            "errors": [],
        }
    elif reason == "cancel" and (result == "stopped" or killed):
        status = "cancelled"
        if killed:
            error = {
                "message": f"killed after not stopping within {settings.cancel_grace_s:g} s of the cancel",
                "errors": [],
            }
    elif result == "failed":
        status, error = "failed", outcome.get("error") if outcome else None
    elif result == "stopped":
        status = "interrupted"
        error = {"message": "the job stopped before its last step; resume it to continue", "errors": []}
    else:
        status = "failed"
        how = f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
        hint = " (out of memory?)" if exitcode == -signal.SIGKILL else ""
        error = {
            "message": f"the job's process died with {how}{hint} before reporting an outcome",
            "errors": [],
        }
    with write_session(settings) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.attempt != attempt or job.status not in ("running", "interrupted"):
            return "superseded"
        job.finished_at, job.heartbeat_at, job.cancel_request = utcnow(), None, None
        if policy:
            job.policy = {**(job.policy or {}), **policy} if isinstance(policy, dict) else job.policy
        event = status_event(
            session, job, status, error=error, message=f"attempt {attempt}: {result or 'no outcome'}"
        )
        # Only while it still names this job: a job process outliving its worker ends after the next worker
        # may have started another job.
        session.execute(
            sa.update(Host)
            .where(Host.name == settings.host_name, Host.current_job_id == job_id)
            .values(current_job_id=None)
        )
    live.publish(settings, job_id, event)
    log.info("job %s attempt %s: %s", job_id, attempt, status)
    return status
