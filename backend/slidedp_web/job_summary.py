"""The few figures that tell runs apart in the jobs list (docs/interfaces.md §6, `summary`): final loss, final
eval loss, median tokens/s and how long the job ran.

The list is polled every few seconds, and a page holds up to `SLIDEDP_MAX_PAGE_SIZE` jobs of any length, so the
figures of a whole page cost two queries whatever its size: one reads the few numbers each stored step needs
(the database extracts them from the records' JSON, so no record is parsed here), one the status history. A job's
metric figures are kept per process, keyed by the job's last event id: every stored record is an event, so the key
changes whenever the records can have, and a finished job is read once.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from sqlmodel import Session, select

from slidedp_web.models import JobRecord, JobSummary, Metric, StatusChange, as_utc, utcnow

CACHE_MAX = 4096


@dataclass(frozen=True)
class _MetricFigures:
    final_loss: Optional[float] = None
    final_eval_loss: Optional[float] = None
    final_eval_step: Optional[int] = None
    median_tokens_per_s: Optional[float] = None


_cache: OrderedDict[tuple, _MetricFigures] = OrderedDict()
_cache_lock = threading.Lock()


def summaries(session: Session, jobs: Sequence[JobRecord], now: Optional[datetime] = None) -> dict[int, JobSummary]:
    """The summary of each job, by id."""
    if not jobs:
        return {}
    ids = [j.id for j in jobs]
    database = str(session.get_bind().url)
    keys = {j.id: (database, j.id, as_utc(j.created_at), j.event_seq) for j in jobs}
    with _cache_lock:
        figures = {jid: _cache[key] for jid, key in keys.items() if key in _cache}
    stale = [jid for jid in ids if jid not in figures]
    if stale:
        fresh = _metric_figures(session, stale)
        with _cache_lock:
            for jid in stale:
                figures[jid] = _cache[keys[jid]] = fresh.get(jid, _MetricFigures())
                _cache.move_to_end(keys[jid])
            while len(_cache) > CACHE_MAX:
                _cache.popitem(last=False)
    ran = _run_seconds(session, jobs, now or utcnow())
    return {
        j.id: JobSummary(
            final_loss=figures[j.id].final_loss,
            final_eval_loss=figures[j.id].final_eval_loss,
            final_eval_step=figures[j.id].final_eval_step,
            median_tokens_per_s=figures[j.id].median_tokens_per_s,
            duration_s=ran.get(j.id),
        )
        for j in jobs
    }


def _metric_figures(session: Session, ids: list[int]) -> dict[int, _MetricFigures]:
    """One pass over the stored steps of these jobs, in step order (a resumed job's repeated steps are stored
    once, the newer record: the same records its charts draw)."""
    rows = session.exec(
        select(
            Metric.job_id,
            Metric.step,
            Metric.data["loss"].as_float(),
            Metric.data["eval_loss"].as_float(),
            Metric.data["tokens_per_s"].as_float(),
        )
        .where(Metric.job_id.in_(ids))
        .order_by(Metric.job_id, Metric.step)
    ).all()
    return {job_id: _figures(list(steps)) for job_id, steps in itertools.groupby(rows, key=lambda row: row[0])}


def _figures(rows: Sequence[tuple]) -> _MetricFigures:
    """Figures of one job from its (job_id, step, loss, eval_loss, tokens_per_s) rows in step order. A value the
    record holds as null (not finite, or not measured) reads as None."""
    final_loss = rows[-1][2]
    evals = [(step, value) for _, step, _, value, _ in rows if value is not None]
    # The first step is the warm-up (compilation, allocation, cold caches): its rate says little about the run.
    # A job of one step has only that one.
    rates = [r[4] for r in rows[1:] if r[4] is not None] or [r[4] for r in rows[:1] if r[4] is not None]
    return _MetricFigures(
        final_loss=final_loss,
        final_eval_loss=evals[-1][1] if evals else None,
        final_eval_step=evals[-1][0] if evals else None,
        median_tokens_per_s=statistics.median(rates) if rates else None,
    )


def _run_seconds(session: Session, jobs: Sequence[JobRecord], now: datetime) -> dict[int, float]:
    """Seconds each job spent running, summed over its attempts: each `running` status change to the change that
    followed it, and to now for the attempt still running. For a job that ran once: started_at → finished_at."""
    rows = session.exec(
        select(StatusChange.job_id, StatusChange.status, StatusChange.ts)
        .where(StatusChange.job_id.in_([j.id for j in jobs]))
        .order_by(StatusChange.job_id, StatusChange.id)
    ).all()
    status = {j.id: j.status for j in jobs}
    total: dict[int, float] = {}
    since: dict[int, Optional[datetime]] = {}
    for job_id, change, ts in rows:
        ts = as_utc(ts)
        began = since.get(job_id)
        if began is not None:
            total[job_id] = total.get(job_id, 0.0) + max(0.0, (ts - began).total_seconds())
            since[job_id] = None
        if change == "running":
            since[job_id] = ts
            total.setdefault(job_id, 0.0)
    for job_id, began in since.items():
        if began is not None and status.get(job_id) == "running":
            total[job_id] = total.get(job_id, 0.0) + max(0.0, (now - began).total_seconds())
    return total
