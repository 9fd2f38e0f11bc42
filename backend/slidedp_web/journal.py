"""The job journal: every change of a job (status, per-step metrics, log lines) as rows plus one event each.

Each event takes the job's next sequence number in the same transaction that writes it, so the SSE ids of a
job are gap-free and increasing, and a client that reconnects with Last-Event-ID misses nothing. Events are
published on Redis only after the transaction commits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Session

from slidedp_web import live
from slidedp_web.core.config import Settings
from slidedp_web.core.db import write_session
from slidedp_web.models import Event, JobRecord, LogLine, Metric, StatusChange, iso, utcnow


def clean_json(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become null (Postgres' JSON rejects them), unknown types strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return clean_json(value.item())
    return json.loads(json.dumps(value, default=str))


def next_seq(session: Session, job_id: int, column: str = "event_seq") -> Optional[int]:
    col = getattr(JobRecord, column)
    row = session.execute(
        sa.update(JobRecord).where(JobRecord.id == job_id).values({column: col + 1}).returning(col)
    ).first()
    return row[0] if row else None


def add_event(session: Session, job_id: int, kind: str, data: dict[str, Any], ts: datetime) -> Optional[dict]:
    seq = next_seq(session, job_id)
    if seq is None:
        return None  # the job was deleted meanwhile
    session.add(Event(job_id=job_id, seq=seq, kind=kind, ts=ts, data=data))
    return {"id": seq, "event": kind, "data": data}


def status_event(
    session: Session, job: JobRecord, status: str, *, error: Optional[dict] = None, message: Optional[str] = None
) -> Optional[dict]:
    """Record job.status = status (the caller has set the job's other fields) with its history row and event."""
    ts = utcnow()
    job.status = status
    if error is not None:
        job.error = error
    session.add(job)
    session.add(StatusChange(job_id=job.id, status=status, attempt=job.attempt, ts=ts, message=message))
    data: dict[str, Any] = {"status": status, "ts": iso(ts)}
    if job.error and status in ("failed", "interrupted", "cancelled"):
        data["error"] = job.error
    return add_event(session, job.id, "status", data, ts)


def set_status(
    settings: Settings,
    job_id: int,
    status: str,
    *,
    only_from: tuple[str, ...] = (),
    attempt: Optional[int] = None,
    error: Optional[dict] = None,
    message: Optional[str] = None,
    check: Optional[Callable[[JobRecord], bool]] = None,
    **fields: Any,
) -> Optional[JobRecord]:
    """Move a job to `status` (only from the listed statuses, for that attempt, and when `check(job)` holds, each
    when given, judged under the write lock); None if it did not."""
    with write_session(settings) as session:
        job = session.get(JobRecord, job_id, with_for_update=True)
        if job is None or (only_from and job.status not in only_from):
            return None
        if (attempt is not None and job.attempt != attempt) or (check is not None and not check(job)):
            return None
        for key, value in fields.items():
            setattr(job, key, value)
        event = status_event(session, job, status, error=error, message=message)
    live.publish(settings, job_id, event)
    return job


def record_metrics(settings: Settings, job_id: int, record: dict[str, Any]) -> None:
    record = clean_json(record)
    step = int(record.get("step", 0))
    ts = utcnow()
    raised = [w for w in record.get("warnings") or [] if isinstance(w, dict)]
    events: list[dict] = []
    with write_session(settings) as session:
        event = add_event(session, job_id, "metrics", record, ts)
        if event is None:
            return
        events.append(event)
        # A resumed job repeats the steps after its checkpoint: the newer record of a step wins.
        session.execute(sa.delete(Metric).where(Metric.job_id == job_id, Metric.step == step))
        session.add(Metric(job_id=job_id, step=step, ts=ts, data=record))
        values: dict[str, Any] = {"step": step, "last_metrics": record}
        if raised:  # kept with the job (a repeated step's warning once) and sent as their own events
            job = session.get(JobRecord, job_id)
            kept = list((job.warnings if job is not None else None) or [])
            seen = {(w.get("step"), w.get("kind")) for w in kept}
            for w in raised:
                if (w.get("step"), w.get("kind")) not in seen:
                    kept.append(w)
                    seen.add((w.get("step"), w.get("kind")))
                    warning = add_event(session, job_id, "warning", w, ts)
                    if warning is not None:
                        events.append(warning)
            values["warnings"] = kept
        session.execute(sa.update(JobRecord).where(JobRecord.id == job_id).values(**values))
    for e in events:
        live.publish(settings, job_id, e)


def record_stage(settings: Settings, job_id: int, stage: dict[str, Any]) -> None:
    """Where the attempt's start-up is (slidedp.startup's on_stage, or the job process's own "preparing"):
    kept as the job's `stage` and sent as a `stage` event."""
    stage = clean_json(stage)
    with write_session(settings) as session:
        event = add_event(session, job_id, "stage", stage, utcnow())
        if event is None:
            return
        session.execute(sa.update(JobRecord).where(JobRecord.id == job_id).values(stage=stage))
    live.publish(settings, job_id, event)


def record_log(settings: Settings, job_id: int, line: str) -> None:
    line = line.rstrip("\n")[: settings.max_log_line_chars]
    ts = utcnow()
    with write_session(settings) as session:
        seq = next_seq(session, job_id, "log_seq")
        if seq is None:
            return
        session.add(LogLine(job_id=job_id, seq=seq, ts=ts, line=line))
        event = add_event(session, job_id, "log", {"seq": seq, "ts": iso(ts), "line": line}, ts)
    live.publish(settings, job_id, event)
