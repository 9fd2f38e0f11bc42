"""A job attempt's record while it runs and when it ends: the heartbeat and cancel request, and the status, error
and resolved policy its outcome gives the job.

The worker's supervisor (tasks.py) keeps it, and the job process itself (job_process.py) when its worker died
first: this module is what both share.
"""

from __future__ import annotations

import logging
import signal
from typing import Optional

import sqlalchemy as sa

from slidedp_web import live
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session, write_session
from slidedp_web.journal import clean_json, status_event
from slidedp_web.models import Host, JobRecord, utcnow
from slidedp_web.planning import in_todays_shape

log = logging.getLogger(__name__)
STOP, SAVE = 1, 2  # the job process's stop flag: stop at the next step boundary, or save a checkpoint first


def finish(
    settings: Settings,
    job_id: int,
    attempt: int,
    outcome: Optional[dict],
    reason: Optional[str],
    killed: bool,
    exitcode: Optional[int],
) -> str:
    """Record how the attempt ended (the job process's outcome, or why it has none: the worker's reason, a kill,
    its exit code) and publish the status event; "superseded" when a newer attempt or a cancel owns the job."""
    plan = clean_json(outcome.get("policy")) if outcome else None  # the plan run, with its resolved policy
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
        job = session.get(JobRecord, job_id, with_for_update=True)
        if job is None or job.attempt != attempt or job.status not in ("running", "interrupted"):
            return "superseded"
        job.finished_at, job.heartbeat_at, job.cancel_request = utcnow(), None, None
        if plan:
            # Merged, so the submit-time plan's keys the run does not restate are kept; a legacy row is read into
            # today's shape first, or its old run's top-level keys would outlive this run (planning.job_policy).
            job.plan = {**(in_todays_shape(job.plan) or {}), **plan} if isinstance(plan, dict) else job.plan
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


def heartbeat(settings: Settings, job_id: int, attempt: int, write: bool) -> Optional[str]:
    """Write the heartbeat (when due) and return the job's cancel request, if any."""
    if write:
        with write_session(settings) as session:
            session.execute(
                sa.update(JobRecord).where(JobRecord.id == job_id, JobRecord.attempt == attempt).values(heartbeat_at=utcnow())
            )
    with read_session(settings) as session:
        row = session.execute(sa.select(JobRecord.cancel_request).where(JobRecord.id == job_id)).first()
    return row[0] if row else "stop"  # a deleted job stops
