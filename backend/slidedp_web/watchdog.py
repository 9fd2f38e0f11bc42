"""The API's background duties: notice Redis coming back (and re-send the queued jobs it lost), and mark
interrupted the running jobs whose worker stopped sending heartbeats.

Redis may come back empty (no persistence, a new container). A marker key, written once the queued jobs
are on the broker, tells whether this Redis still holds them: if the marker is gone, every job the database
says is queued is sent again. Duplicates are harmless: a worker starts a job only by claiming it.
"""

from __future__ import annotations

import logging

import anyio
import redis

from slidedp_web import jobs, live
from slidedp_web.core.config import Settings

log = logging.getLogger(__name__)
MARKER = "slidedp:queue-marker"


def check_broker(settings: Settings, state: dict) -> None:
    try:
        client = live.client(settings)
        client.ping()
    except (redis.RedisError, OSError) as exc:
        if state.get("redis", True):
            log.warning("Redis at %s unreachable: %s", settings.redis_url, exc)
        state["redis"] = False
        return
    if not state.get("redis", True):
        log.info("Redis at %s is back", settings.redis_url)
    state["redis"] = True
    try:
        if not client.exists(MARKER):
            sent = jobs.requeue_queued(settings)
            client.set(MARKER, "1")
            if sent:
                log.info("Redis had no record of the queue: %d queued job(s) sent again", sent)
    except (redis.RedisError, OSError) as exc:
        log.warning("re-sending queued jobs failed (will retry): %s", exc)
    except Exception as exc:  # noqa: BLE001 - kombu wraps connection errors in its own types
        log.warning("re-sending queued jobs failed (will retry): %s", exc)


def tick(settings: Settings, state: dict) -> None:
    check_broker(settings, state)
    try:
        for job_id in jobs.interrupt_stale(settings):
            log.warning("job %s interrupted: its worker stopped sending heartbeats", job_id)
    except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the watchdog
        log.warning("heartbeat sweep failed: %s", exc)


async def run(settings: Settings) -> None:
    state: dict = {}
    while True:
        await anyio.to_thread.run_sync(tick, settings, state)
        await anyio.sleep(settings.watchdog_s)
