"""The job queue: a Celery app on the Redis broker, one queue per GPU host.

Why the acknowledgement and timeout settings are what they are (celery#5935): with the Redis broker, a
message that is not acknowledged within the visibility timeout is put back on its queue and delivered again,
to any worker, while the first delivery may still be running. A fine-tuning job runs for hours, longer than
any timeout one would pick, so

* jobs are acknowledged when they start (``task_acks_late = False``): a running job has no unacknowledged
  message left that could come back. What a worker crash loses is recorded in the database instead: the job's
  heartbeat stops, the API marks it *interrupted*, and the user resumes it from its last checkpoint;
* a worker holds no message it has not started (``worker_disable_prefetch``, prefetch multiplier 1) and runs one
  job at a time on one pool thread, which spawns the job's process. Not the solo pool: it runs the task on the
  worker's event loop, and the acknowledgement is scheduled on that same loop, so it would only go out when
  the job ends — acknowledgement at the end in all but name (tests/backend/test_queue_faults.py pins this);
* the visibility timeout (SLIDEDP_BROKER_VISIBILITY_TIMEOUT_S, one hour by default) therefore only governs a
  message a worker had received but not started when it died; it comes back after that time;
* every message names its job and attempt, and a worker starts a job only by claiming it in the database
  (queued -> running for that attempt, one atomic UPDATE): a duplicate or stale message is dropped. That makes
  re-sending queued jobs from the database, when Redis lost them, safe.
"""

from __future__ import annotations

import threading

from celery import Celery

from slidedp_web.core.config import Settings, get_settings

TASK_NAME = "slidedp.run_job"
GENERATE_TASK = "slidedp.run_generation"  # a prompt for a job's model, on the job's queue (generations.py)
_apps: dict[str, Celery] = {}
_lock = threading.Lock()


def make_celery(settings: Settings) -> Celery:
    app = Celery("slidedp", broker=settings.broker_url, include=["slidedp_web.tasks"])
    vt = float(settings.broker_visibility_timeout_s)
    app.conf.update(
        task_acks_late=False,
        task_reject_on_worker_lost=False,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=settings.queue,
        task_create_missing_queues=True,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        worker_concurrency=1,
        worker_pool="threads",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options={
            "visibility_timeout": vt,
            # Scan for expired unacknowledged messages often enough that the timeout means what it says.
            "unacked_restore_interval": max(1.0, min(10.0, vt / 4)),
            "unacked_restore_throttle": 1,
            "socket_connect_timeout": 2,
            "socket_timeout": 30,
            "socket_keepalive": True,
        },
        broker_heartbeat=0,
    )
    return app


def get_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    key = f"{settings.broker_url}|{settings.queue}|{settings.broker_visibility_timeout_s}"
    with _lock:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = make_celery(settings)
        return app


def enqueue(settings: Settings, job_id: int, attempt: int, queue: str) -> None:
    """Send one run message for (job, attempt) to a host's queue; raises when the broker is unreachable."""
    # Two quick retries cover a pooled broker connection gone stale across a Redis restart; an unreachable Redis
    # still fails within a second (connection refused), and the API answers 503.
    get_celery(settings).send_task(
        TASK_NAME,
        args=[job_id, attempt],
        queue=queue,
        ignore_result=True,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
    )


def enqueue_generation(settings: Settings, generation_id: int, queue: str) -> None:
    """Send one generation message to the job's queue: the host's single worker thread takes it after whatever
    is ahead of it (a running job first), so a generation never competes with training for the host."""
    get_celery(settings).send_task(
        GENERATE_TASK,
        args=[generation_id],
        queue=queue,
        ignore_result=True,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
    )
