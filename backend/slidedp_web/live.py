"""Redis as the carrier of live events: one pub/sub channel per job, and the health of the connection.

Nothing here is the record: every event is first committed to the database (journal.py) and then published,
so a subscriber that missed a message finds it in the database by its sequence number.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import redis
import redis.asyncio as aioredis

from slidedp_web.core.config import Settings
from slidedp_web.errors import Unavailable

log = logging.getLogger(__name__)
_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()
TIMEOUT_S = 2.0


def channel(job_id: int) -> str:
    return f"slidedp:job:{job_id}"


def client(settings: Settings) -> redis.Redis:
    with _lock:
        c = _clients.get(settings.redis_url)
        if c is None:
            c = _clients[settings.redis_url] = redis.Redis.from_url(
                settings.redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
            )
        return c


def async_client(settings: Settings) -> aioredis.Redis:
    return aioredis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=TIMEOUT_S, health_check_interval=10
    )


def reachable(settings: Settings) -> bool:
    try:
        return bool(client(settings).ping())
    except (redis.RedisError, OSError):
        return False


def unavailable(settings: Settings, what: str) -> Unavailable:
    return Unavailable(
        f"Redis at {settings.redis_url} is not reachable, so {what} is unavailable right now. "
        "Jobs, metrics and logs can still be read. Start Redis (or point REDIS_URL at a running one) and retry; "
        "jobs already queued are sent to their workers again when Redis is back.",
    )


def require(settings: Settings, what: str) -> None:
    if not reachable(settings):
        raise unavailable(settings, what)


def publish(settings: Settings, job_id: int, event: dict[str, Any]) -> None:
    """Best effort: the event is already in the database; a live reader polls it when Redis is away."""
    try:
        client(settings).publish(channel(job_id), json.dumps(event))
    except (redis.RedisError, OSError) as exc:
        log.debug("live event for job %s not published: %s", job_id, exc)
