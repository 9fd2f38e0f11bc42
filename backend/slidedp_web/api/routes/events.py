"""The live stream of a job: Server-Sent Events `metrics`, `status` and `log`, read from the database.

Every event is a row with the job's next sequence number (journal.py), and that number is the SSE id. The
stream replays the rows after Last-Event-ID (or ?last_event_id=) and then follows new ones: a Redis pub/sub
message wakes it up, and it re-reads the database every few seconds in case a message was lost, so a client
that reconnects sees every event exactly once, in order. The stream ends after the job reaches a terminal
status and every event up to it was sent; a reconnect after that end is answered 204, which stops a browser's
EventSource from reconnecting.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Optional

import anyio
import redis
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import Field, TypeAdapter, ValidationError
from sqlmodel import select
from sse_starlette import EventSourceResponse, ServerSentEvent

from slidedp_web import live
from slidedp_web.api.deps import DB_INT_MAX, JobId, SessionDep, SettingsDep
from slidedp_web.core.config import Settings
from slidedp_web.core.db import read_session
from slidedp_web.jobs import get_or_404, is_terminal
from slidedp_web.models import Event, JobRecord

router = APIRouter(prefix="/jobs", tags=["events"])
log = logging.getLogger(__name__)
BATCH = 500
POLL_S = 3.0  # re-read the database this often even without a wake-up


def _fetch(settings: Settings, job_id: int, after: int) -> tuple[list[Event], Optional[JobRecord]]:
    with read_session(settings) as session:
        job = session.get(JobRecord, job_id)
        rows = session.exec(
            select(Event).where(Event.job_id == job_id, Event.seq > after).order_by(Event.seq).limit(BATCH)
        ).all()
        return list(rows), job


@router.get(
    "/{job_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "events `metrics`, `status`, `log`; ids are the job's event sequence",
        },
        204: {"description": "The job has ended and the client has every event (EventSource stops)"},
        503: {"description": "Redis is unreachable"},
    },
)
async def job_events(
    job_id: JobId,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    last_event_id: Optional[int] = Query(None, ge=0, le=DB_INT_MAX, description="Resume after this event id"),
    last_event_id_header: Optional[str] = Header(None, alias="Last-Event-ID"),
) -> Response:
    after = max(last_event_id or 0, _header_cursor(last_event_id_header))
    job = get_or_404(session, job_id)
    session.close()
    if is_terminal(job.status) and after >= job.event_seq:
        # Nothing more will come: 204 is how SSE tells a browser's EventSource to stop reconnecting.
        return Response(status_code=204)
    live.require(settings, "the live event stream")
    return EventSourceResponse(
        _stream(request, settings, job_id, after), ping=15, headers={"X-Accel-Buffering": "no"}
    )


# The header is held to the query parameter's own rule, so that a cursor means the same wherever it is sent.
_CURSOR = TypeAdapter(Annotated[int, Field(ge=0, le=DB_INT_MAX)])


def _header_cursor(value: Optional[str]) -> int:
    """The event id a Last-Event-ID header resumes after (0: none sent); a 422 for one that is not an event id."""
    if value is None or value == "":
        return 0  # EventSource sends an empty id when the last event it saw had none
    try:
        return _CURSOR.validate_python(value)
    except ValidationError as exc:
        shown = value if len(value) <= 24 else value[:24] + "..."
        raise RequestValidationError([
            {**e, "loc": ("header", "Last-Event-ID"), "input": shown,
             "msg": f"{e['msg']}: Last-Event-ID must be the id of an event this stream sent (an integer from 0 to "
             f"{DB_INT_MAX}), got {shown!r}; leave it out to receive the job's events from the start"}
            for e in exc.errors(include_url=False, include_context=False)
        ]) from None


async def _stream(request: Request, settings: Settings, job_id: int, after: int) -> AsyncIterator[Any]:
    client = live.async_client(settings)
    pubsub: Any = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(live.channel(job_id))
    except (redis.RedisError, OSError):
        pubsub = None  # carry on from the database alone
    last = after
    try:
        while True:
            rows, job = await anyio.to_thread.run_sync(_fetch, settings, job_id, last)
            for row in rows:
                last = row.seq
                yield ServerSentEvent(
                    data=json.dumps(row.data, separators=(",", ":")), event=row.kind, id=str(row.seq)
                )
            if job is None:
                return  # deleted
            if len(rows) == BATCH:
                continue
            if is_terminal(job.status) and last >= job.event_seq:
                return
            if await request.is_disconnected():
                return
            pubsub = await _wait(pubsub)
    finally:
        if pubsub is not None:
            try:
                await pubsub.aclose()
            except (redis.RedisError, OSError):
                pass
        await client.aclose()


async def _wait(pubsub: Any) -> Any:
    """Until a wake-up message or POLL_S; a broken subscription degrades to polling."""
    if pubsub is None:
        await anyio.sleep(POLL_S)
        return None
    try:
        with anyio.move_on_after(POLL_S):
            while True:
                message = await pubsub.get_message(timeout=POLL_S)
                if message is not None:
                    return pubsub
    except (redis.RedisError, OSError) as exc:
        log.info("live events degraded to polling: %s", exc)
        await anyio.sleep(POLL_S)
        return None
    return pubsub
