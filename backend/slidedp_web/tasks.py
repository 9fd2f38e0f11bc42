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

from celery import shared_task
from celery.signals import worker_shutting_down

from slidedp_web import job_process, live, logs
from slidedp_web.celery_app import GENERATE_TASK, TASK_NAME
from slidedp_web.core.config import Settings, get_settings
from slidedp_web.core.db import read_session, write_session
from slidedp_web.hosts import report, set_current_job
from slidedp_web.journal import record_log, status_event
from slidedp_web.models import JobRecord, utcnow
from slidedp_web.outcome import SAVE, STOP, finish, heartbeat

log = logging.getLogger(__name__)


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


def claim(settings: Settings, job_id: int, attempt: int) -> Optional[JobRecord]:
    """queued -> running for exactly this attempt, atomically; None for a duplicate or stale message."""
    with write_session(settings) as session:
        job = session.get(JobRecord, job_id, with_for_update=True)
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
            current = session.get(JobRecord, job_id)
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
            request = heartbeat(settings, job_id, attempt, write=now >= next_beat)
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
    return finish(settings, job_id, attempt, outcome, reason, killed, proc.exitcode)


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
