"""Prometheus metrics of the workbench at `GET /metrics` (text exposition format), read fresh at every scrape.

Everything comes from the record, not from counters kept in the API process: jobs by status and the figures of
running jobs from the database, queue lengths from Redis, online workers from the hosts table. So several API
processes answer the same figures, a restarted one loses nothing, and a scrape costs a few small queries.

    slidedp_jobs{status}                    jobs in the database by status (every status, zeros included)
    slidedp_queue_length{queue}             run messages waiting on a worker queue (absent while Redis is down)
    slidedp_redis_up, slidedp_database_up   1 when reachable, else 0
    slidedp_workers_online                  worker hosts that reported recently (GET /api/hosts "online")
    slidedp_job_step{job_id,host}           last finished optimizer step of each running job
    slidedp_job_steps{job_id,host}          steps configured
    slidedp_job_step_time_seconds{...}      step_time_s of the newest metrics record
    slidedp_job_tokens_per_second{...}      tokens_per_s of the newest metrics record
    slidedp_job_loss{...}                   loss of the newest metrics record
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlmodel import func, select

from slidedp_web import live
from slidedp_web.api.deps import SettingsDep, require_token
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session
from slidedp_web.hosts import online_hosts
from slidedp_web.models import Host, JobRecord, JobStatus

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_token)])
log = logging.getLogger(__name__)
STATUSES: tuple[str, ...] = JobStatus.__args__  # type: ignore[attr-defined]
RUNNING_JOB_FIGURES = (  # metric name, metrics record key, help
    ("slidedp_job_step_time_seconds", "step_time_s", "Step time of the newest step of a running job"),
    (
        "slidedp_job_tokens_per_second",
        "tokens_per_s",
        "Tokens per second of the newest step of a running job",
    ),
    ("slidedp_job_loss", "loss", "Loss of the newest step of a running job"),
)


class WorkbenchCollector:
    """One scrape: the database and Redis read now (prometheus_client calls collect() per exposition)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.queues: set[str] = {settings.queue}  # plus every host's and every queued job's, read below

    def collect(self) -> Iterator[Metric]:
        database = GaugeMetricFamily("slidedp_database_up", "1 when the database answers, else 0")
        try:
            yield from self._from_database()
            database.add_metric([], 1)
        except Exception as exc:  # noqa: BLE001 - a scrape reports the outage instead of failing
            log.warning("metrics: database unreachable: %s", exc)
            database.add_metric([], 0)
        yield database
        yield from self._from_redis()

    def _from_database(self) -> Iterator[Metric]:
        with read_session(self.settings) as session:
            counts = dict(session.exec(select(JobRecord.status, func.count()).group_by(JobRecord.status)).all())
            running = session.exec(select(JobRecord).where(JobRecord.status == "running").order_by(JobRecord.id)).all()
            workers = len(online_hosts(session, self.settings))
            self.queues.update(session.exec(select(Host.queue)).all())
            self.queues.update(session.exec(select(JobRecord.queue).where(JobRecord.status == "queued").distinct()).all())
        jobs = GaugeMetricFamily("slidedp_jobs", "Jobs in the database by status", labels=["status"])
        for status in STATUSES:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        online = GaugeMetricFamily("slidedp_workers_online", "Worker hosts that reported recently")
        online.add_metric([], workers)
        yield online
        labels = ["job_id", "host"]
        step = GaugeMetricFamily(
            "slidedp_job_step", "Last finished optimizer step of a running job", labels=labels
        )
        steps = GaugeMetricFamily(
            "slidedp_job_steps", "Optimizer steps configured for a running job", labels=labels
        )
        figures = {name: GaugeMetricFamily(name, doc, labels=labels) for name, _, doc in RUNNING_JOB_FIGURES}
        for job in running:
            key = [str(job.id), job.host or ""]
            step.add_metric(key, job.step)
            steps.add_metric(key, job.steps)
            record: dict[str, Any] = job.last_metrics or {}
            for name, field, _ in RUNNING_JOB_FIGURES:
                value = record.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    figures[name].add_metric(key, float(value))
        yield step
        yield steps
        yield from figures.values()

    def _from_redis(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("slidedp_redis_up", "1 when Redis (the queue broker) answers, else 0")
        lengths = GaugeMetricFamily(
            "slidedp_queue_length", "Run messages waiting on a worker queue", labels=["queue"]
        )
        queues = sorted(self.queues)
        try:
            client = live.client(self.settings)
            pipe = client.pipeline(transaction=False)
            for queue in queues:
                pipe.llen(queue)
            for queue, length in zip(queues, pipe.execute()):
                lengths.add_metric([queue], int(length))
            up.add_metric([], 1)
        except (redis.RedisError, OSError) as exc:
            log.info("metrics: Redis unreachable, queue lengths left out: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        yield up
        yield lengths


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "Prometheus text format"}
    },
)
def metrics(settings: SettingsDep) -> Response:
    """The workbench's Prometheus metrics (jobs by status, queue lengths, running jobs' step time, tokens/s and
    loss, workers online, Redis and database up)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkbenchCollector(settings))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
