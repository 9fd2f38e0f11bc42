from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from fastapi import APIRouter, Body, HTTPException, Query, Response
from fastapi.responses import StreamingResponse
from sqlmodel import func, select
from starlette.concurrency import run_in_threadpool

from slidedp_web import job_summary, jobs, outputs
from slidedp_web.api.deps import DB_INT_MAX, JobId, SessionDep, SettingsDep
from slidedp_web.export_archive import stream_tar_gz
from slidedp_web.job_schema import request_body_openapi
from slidedp_web.models import (
    CancelRequest,
    CheckpointList,
    JobList,
    JobListItem,
    JobPublic,
    JobRecord,
    JobStatus,
    LogItem,
    LogLine,
    LogList,
    Metric,
    MetricsList,
    iso,
)

router = APIRouter(prefix="/jobs", tags=["jobs"])
ROWS_MAX = 10_000


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    settings: SettingsDep,
    status: Optional[JobStatus] = None,
    limit: int = Query(50, ge=1),
    offset: int = Query(0, ge=0, le=DB_INT_MAX),
) -> JobList:
    """Jobs, newest first, optionally with one status; each with the summary that tells runs apart (final loss,
    final eval loss, median tokens/s, time run)."""
    limit = min(limit, settings.max_page_size)
    query, count = select(JobRecord), select(func.count()).select_from(JobRecord)
    if status:
        query, count = query.where(JobRecord.status == status), count.where(JobRecord.status == status)
    rows = session.exec(query.order_by(JobRecord.id.desc()).offset(offset).limit(limit)).all()
    figures = job_summary.summaries(session, rows)
    items = [JobListItem(**jobs.public(j).model_dump(), summary=figures[j.id]) for j in rows]
    return JobList(items=items, total=session.exec(count).one())


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    openapi_extra=request_body_openapi("Job config keys at the top level, plus optional `name`, `host`."),
    responses={
        422: {"description": "A bad field, named by its config key path"},
        503: {"description": "Redis is unreachable; nothing was created"},
    },
)
def create_job(session: SessionDep, settings: SettingsDep, body: Any = Body(...)) -> JobPublic:
    """Validate a job (config schema, model, dataset, host RAM of the target host), plan it and enqueue it."""
    return jobs.public(jobs.create(settings, session, body))


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: JobId, session: SessionDep) -> JobPublic:
    return jobs.public(jobs.get_or_404(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(job_id: JobId, settings: SettingsDep, body: Optional[CancelRequest] = None) -> JobPublic:
    """Stop at the next step boundary (with `save`, after writing a checkpoint); a queued job is cancelled at
    once. A job that does not stop within SLIDEDP_CANCEL_GRACE_S is killed."""
    return jobs.public(jobs.cancel(settings, job_id, save=bool(body and body.save)))


@router.post("/{job_id}/resume", response_model=JobPublic)
def resume_job(job_id: JobId, settings: SettingsDep) -> JobPublic:
    """Queue a failed, cancelled or interrupted job again; it continues from its newest checkpoint."""
    return jobs.public(jobs.resume(settings, job_id))


@router.delete("/{job_id}", status_code=204, response_class=Response)
def delete_job(job_id: JobId, settings: SettingsDep) -> Response:
    """Delete the job's rows and its output directory (a running job must be cancelled first)."""
    jobs.delete(settings, job_id)
    return Response(status_code=204)


@router.get("/{job_id}/metrics", response_model=MetricsList)
def job_metrics(
    job_id: JobId,
    session: SessionDep,
    after_step: int = Query(0, ge=0, le=DB_INT_MAX),
    limit: int = Query(ROWS_MAX, ge=1),
) -> MetricsList:
    """Per-step metrics records (docs/interfaces.md §3) with step > after_step, in step order."""
    jobs.get_or_404(session, job_id)
    rows = session.exec(
        select(Metric.data)
        .where(Metric.job_id == job_id, Metric.step > after_step)
        .order_by(Metric.step)
        .limit(min(limit, ROWS_MAX))
    ).all()
    return MetricsList(items=list(rows))


@router.get("/{job_id}/logs", response_model=LogList)
def job_logs(
    job_id: JobId,
    session: SessionDep,
    after_seq: int = Query(0, ge=0, le=DB_INT_MAX),
    limit: int = Query(ROWS_MAX, ge=1),
) -> LogList:
    """Log lines with seq > after_seq, in order."""
    jobs.get_or_404(session, job_id)
    rows = session.exec(
        select(LogLine)
        .where(LogLine.job_id == job_id, LogLine.seq > after_seq)
        .order_by(LogLine.seq)
        .limit(min(limit, ROWS_MAX))
    ).all()
    return LogList(items=[LogItem(seq=r.seq, ts=iso(r.ts), line=r.line) for r in rows])


@router.get("/{job_id}/checkpoints", response_model=CheckpointList)
async def job_checkpoints(job_id: JobId, session: SessionDep) -> CheckpointList:
    job = jobs.get_or_404(session, job_id)
    return CheckpointList(items=await run_in_threadpool(jobs.list_checkpoints, job.output_dir))


@router.get(
    "/{job_id}/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/gzip": {}},
            "description": "The files the export wrote in final/, as .tar.gz",
        },
        404: {"description": "The job does not exist, or has no export (yet)"},
        409: {"description": "final/ no longer holds what the export wrote"},
    },
)
def export_job(job_id: JobId, session: SessionDep) -> StreamingResponse:
    """The exported Hugging Face directory (output_dir/final) as a .tar.gz download: only the files the job's
    export wrote, each as it wrote it."""
    job = jobs.get_or_404(session, job_id)
    try:
        files = outputs.export_listing(Path(job.output_dir), job.outputs)
    except FileNotFoundError:
        raise HTTPException(
            404,
            f"job {job_id} has no export yet; it is written when the job completes with export: true "
            "(POST /api/jobs/{id}/export writes it again from a checkpoint of the last step)".replace(
                "{id}", str(job_id)
            ),
        ) from None
    except ValueError as exc:
        raise HTTPException(
            409,
            f"job {job_id}'s export cannot be sent: {exc}; POST /api/jobs/{job_id}/export "
            "writes it again from a checkpoint of the last step",
        ) from None
    name = f"slidedp-job-{job_id}"
    return StreamingResponse(
        stream_tar_gz(files, name),
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}.tar.gz"'},
    )


@router.post(
    "/{job_id}/export",
    status_code=202,
    response_model=JobPublic,
    responses={
        404: {"description": "The job does not exist"},
        409: {"description": "The job is queued or running, or has no checkpoint of its last step"},
        503: {"description": "Redis is unreachable; nothing was queued"},
    },
)
def request_export(job_id: JobId, settings: SettingsDep) -> JobPublic:
    """Write final/ again from the job's newest checkpoint, which must hold its last step: the retry after an
    export failed (a full disk), on the job's host, queued behind any running job."""
    return jobs.public(jobs.request_export(settings, job_id))
