"""Tickets: one GET of one path without the bearer header, for what a browser cannot give a header to.

A browser's EventSource and a plain download link cannot send `Authorization`, and the API token must not travel
in a URL (URLs are written to access logs, browser history and proxy logs). So a client holding the token asks

    POST /api/tickets  {"path": "/api/jobs/3/events"}
    -> 201 {"ticket": "…", "path": "/api/jobs/3/events", "expires_at": "…Z", "expires_in_s": 60.0}

and opens `GET /api/jobs/3/events?ticket=…` (other query parameters are allowed). The ticket opens that exact
path once, within SLIDEDP_TICKET_TTL_S (60 s by default); a second use, another path, or a later use is a 401.
Only the paths that need one get a ticket: a job's event stream and its export download.

Tickets live in the memory of the API process that issued them: a restart voids them all (the UI asks for a new
one when a stream breaks), and with several API processes behind one address a ticket works only on the process
that issued it. At most SLIDEDP_MAX_TICKETS are outstanding at once (expired ones are dropped first), beyond that
POST /api/tickets answers 429. Without a configured token the API needs no tickets (the UI does not ask for any),
but still issues them, so that one client works against either kind of server.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from slidedp_web.api.deps import DB_INT_MAX

router = APIRouter(prefix="/tickets", tags=["auth"])

# The GET routes a ticket may open, as OpenAPI names them (main.py documents `ticket` on each).
TICKET_ROUTES = ("/api/jobs/{job_id}/events", "/api/jobs/{job_id}/export")
_TICKET_PATH = re.compile(r"/api/jobs/(0|[1-9][0-9]{0,18})/(events|export)")


def ticketable(path: str) -> bool:
    """A path a ticket may be issued for: exactly /api/jobs/<id>/events or /api/jobs/<id>/export."""
    match = _TICKET_PATH.fullmatch(path)
    return bool(match) and int(match.group(1)) <= DB_INT_MAX


@dataclass
class _Entry:
    secret: str
    path: str
    expires: float  # on the store's clock


class TooManyTickets(Exception):
    pass


class TicketStore:
    """Outstanding tickets of this API process, each `<key>.<secret>`: the key finds the entry, the secret is
    compared in constant time. Thread-safe (sync routes and dependencies run in a thread pool)."""

    def __init__(self, ttl_s: float, max_outstanding: int, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_outstanding, self.clock = ttl_s, max_outstanding, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # in issue order, so also in expiry order
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired(self.clock())
            return len(self._entries)

    def _drop_expired(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            del self._entries[key]

    def issue(self, path: str) -> str:
        with self._lock:
            now = self.clock()
            self._drop_expired(now)
            if len(self._entries) >= self.max_outstanding:
                raise TooManyTickets
            key = secrets.token_urlsafe(12)
            while key in self._entries:
                key = secrets.token_urlsafe(12)
            secret = secrets.token_urlsafe(24)
            self._entries[key] = _Entry(secret, path, now + self.ttl_s)
            return f"{key}.{secret}"

    def redeem(self, ticket: str, path: str) -> bool:
        """True, and the ticket is spent, when it is outstanding, unexpired and for `path`."""
        key, sep, secret = ticket.partition(".")
        if not sep:
            return False
        with self._lock:
            now = self.clock()
            self._drop_expired(now)
            entry = self._entries.get(key)
            if entry is None or not secrets.compare_digest(entry.secret.encode(), secret.encode()):
                return False
            if not secrets.compare_digest(entry.path.encode(), path.encode()):
                return False  # left outstanding: the holder may still use it on its own path
            del self._entries[key]
            return True


class TicketRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        ...,
        max_length=64,
        description="The path the ticket opens: /api/jobs/{id}/events or /api/jobs/{id}/export, without a "
        "query string",
        examples=["/api/jobs/3/events"],
    )

    @field_validator("path")
    @classmethod
    def _ticketable(cls, value: str) -> str:
        if not ticketable(value):
            raise ValueError(
                "tickets are issued only for /api/jobs/{id}/events and /api/jobs/{id}/export (no query "
                "string); every other route takes the 'Authorization: Bearer' header"
            )
        return value


class Ticket(BaseModel):
    ticket: str = Field(..., description="Pass as ?ticket= on one GET of `path`")
    path: str
    expires_at: datetime = Field(..., description="When the ticket stops working (UTC)")
    expires_in_s: float = Field(..., description="Its lifetime in seconds (SLIDEDP_TICKET_TTL_S)")


@router.post(
    "",
    status_code=201,
    response_model=Ticket,
    responses={
        401: {
            "description": "Missing or wrong API token (a ticket is obtained with the bearer header, never "
            "with another ticket)"
        },
        422: {
            "description": "`path` is not a job's event stream or export",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
        },
        429: {"description": "SLIDEDP_MAX_TICKETS tickets are outstanding; retry when some have expired"},
    },
)
def create_ticket(body: TicketRequest, request: Request) -> Ticket:
    """A one-time ticket for one GET of `path` by a client that cannot send the bearer header (a browser's
    EventSource, a download link): `GET <path>?ticket=<ticket>`, once, within `expires_in_s`."""
    store: TicketStore = request.app.state.tickets
    try:
        ticket = store.issue(body.path)
    except TooManyTickets:
        raise HTTPException(
            status_code=429,
            detail=f"{store.max_outstanding} tickets are outstanding (SLIDEDP_MAX_TICKETS); they expire "
            f"after {store.ttl_s:g} s",
            headers={"Retry-After": str(max(1, int(store.ttl_s)))},
        ) from None
    return Ticket(
        ticket=ticket,
        path=body.path,
        expires_at=datetime.now(timezone.utc) + timedelta(seconds=store.ttl_s),
        expires_in_s=store.ttl_s,
    )
