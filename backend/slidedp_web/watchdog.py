"""The API's background duties: keep every queued job's run message on the broker, and mark interrupted the
running jobs whose worker stopped sending heartbeats.

The database says which jobs are queued; Redis may have lost their messages (it restarted without persistence,
or a worker took a message and died before claiming the job). Every few seconds the queued jobs that have waited
longer than REQUEUE_AFTER_S are looked up on their queues (and among the messages delivered but not yet
acknowledged); each one whose (job, attempt) message is nowhere is sent again. A duplicate is harmless: a worker
starts a job only by claiming it, so at most one message per attempt ever runs.
"""

from __future__ import annotations

import base64
import json
import logging
from datetime import timedelta
from typing import Any, Optional

import anyio
import redis
import sqlalchemy as sa

from slidedp_web import celery_app, jobs, live
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session
from slidedp_web.models import JobRecord, StatusChange, as_utc, utcnow

log = logging.getLogger(__name__)
REQUEUE_AFTER_S = 10.0  # a message is claimed within milliseconds of delivery; older queued jobs are checked


def message_job(raw: bytes) -> Optional[tuple[int, int]]:
    """(job_id, attempt) of a run message as kombu's Redis transport stores it, else None."""
    try:
        msg = json.loads(raw)
        if isinstance(msg, list):  # the unacked hash stores [message, exchange, routing_key]
            msg = msg[0]
        if msg.get("headers", {}).get("task") != celery_app.TASK_NAME:
            return None
        body = msg["body"]
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0]), int(args[1])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def waiting_jobs(settings: Settings) -> list[tuple[int, int, str]]:
    """(id, attempt, queue) of the jobs queued for longer than REQUEUE_AFTER_S."""
    cutoff = utcnow() - timedelta(seconds=REQUEUE_AFTER_S)
    with read_session(settings) as session:
        rows = session.execute(
            sa.select(JobRecord.id, JobRecord.attempt, JobRecord.queue, sa.func.max(StatusChange.ts))
            .join(StatusChange, StatusChange.job_id == JobRecord.id)
            .where(JobRecord.status == "queued", StatusChange.status == "queued")
            .group_by(JobRecord.id, JobRecord.attempt, JobRecord.queue)
        ).all()
    return [(i, a, q) for i, a, q, ts in rows if ts is None or as_utc(ts) < cutoff]


def resend_lost(settings: Settings) -> int:
    """Send again the run message of every long-waiting queued job that the broker does not hold."""
    waiting = waiting_jobs(settings)
    if not waiting:
        return 0
    client = live.client(settings)
    held: set[tuple[int, int]] = set()
    for queue in {q for _, _, q in waiting}:
        held.update(filter(None, map(message_job, client.lrange(queue, 0, -1))))
    held.update(filter(None, map(message_job, client.hvals("unacked"))))
    sent = 0
    for job_id, attempt, queue in waiting:
        if (job_id, attempt) not in held:
            celery_app.enqueue(settings, job_id, attempt, queue)
            sent += 1
    return sent


def check_broker(settings: Settings, state: dict[str, Any]) -> None:
    try:
        live.client(settings).ping()
    except (redis.RedisError, OSError) as exc:
        if state.get("redis", True):
            log.warning("Redis at %s unreachable: %s", settings.redis_url, exc)
        state["redis"] = False
        return
    if not state.get("redis", True):
        log.info("Redis at %s is back", settings.redis_url)
    state["redis"] = True
    try:
        sent = resend_lost(settings)
        if sent:
            log.info("%d queued job(s) had no message on the broker: sent again", sent)
    except Exception as exc:  # noqa: BLE001 - redis and kombu errors alike: retried at the next tick
        log.warning("checking the queue against the database failed (will retry): %s", exc)


def tick(settings: Settings, state: dict[str, Any]) -> None:
    check_broker(settings, state)
    try:
        for job_id in jobs.interrupt_stale(settings):
            log.warning("job %s interrupted: its worker stopped sending heartbeats", job_id)
    except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the watchdog
        log.warning("heartbeat sweep failed: %s", exc)


async def run(settings: Settings) -> None:
    state: dict[str, Any] = {}
    while True:
        await anyio.to_thread.run_sync(tick, settings, state)
        await anyio.sleep(settings.watchdog_s)
