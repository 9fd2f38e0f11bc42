"""Dependencies of the API routes: settings, a database session, the bearer-token (and ticket) check."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from sqlmodel import Session

from slidedp_web.core.config import Settings, is_loopback
from slidedp_web.core.db import read_session

# Ids and cursors are stored as signed 64-bit integers (SQLite's INTEGER): a larger value in a path or query is a
# 422 naming the parameter, not a database error.
DB_INT_MAX = 2**63 - 1
JobId = Annotated[int, Path(ge=0, le=DB_INT_MAX, description="The job's id")]


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """A session for reads; writes open their own write_session (see core/db.py for why)."""
    with read_session(settings) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _reached_from_outside(request: Request) -> bool:
    """The connection came in on a non-loopback address of this machine (the socket's own side, as uvicorn
    reports it). A unix socket or an in-process client has no IP address and counts as local."""
    server = request.scope.get("server")
    if not server or not server[0]:
        return False
    try:
        ipaddress.ip_address(str(server[0]).split("%", 1)[0])
    except ValueError:
        return False
    return not is_loopback(str(server[0]))


def require_token(request: Request, settings: SettingsDep) -> None:
    """With a token in force (SLIDEDP_API_TOKEN, or the one `slidedp serve` generated for a non-loopback bind),
    every /api request carries `Authorization: Bearer <token>`.

    The one exception is a GET that a browser cannot give a header (the event stream, a download link): it may
    carry `?ticket=` from POST /api/tickets instead, valid once, for exactly its path, for SLIDEDP_TICKET_TTL_S.
    The token itself is never accepted in a URL: URLs end up in access logs, browser history and proxies.

    Without a token the API answers everyone who reaches it, which is this machine only unless it was started
    with --insecure / SLIDEDP_INSECURE=1: a request that came in on a non-loopback address (a plain
    `uvicorn slidedp_web.main:app --host 0.0.0.0`) is refused with 403.
    """
    expected = settings.api_token
    if not expected:
        if not settings.insecure and _reached_from_outside(request):
            raise HTTPException(
                status_code=403,
                detail="this API has no token and answers only on loopback: start it with `slidedp serve "
                "--host <address>`, which generates a token, set SLIDEDP_API_TOKEN, or set "
                "SLIDEDP_INSECURE=1 to serve the network without one",
            )
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip()
    if scheme.lower() == "bearer" and given and secrets.compare_digest(given.encode(), expected.encode()):
        return
    ticket = request.query_params.get("ticket")
    if ticket is not None and request.method == "GET":
        if request.app.state.tickets.redeem(ticket, request.url.path):
            return
        raise HTTPException(
            status_code=401,
            detail="unknown, spent or expired ticket, or one for another path: get a new one with "
            "POST /api/tickets (tickets open one GET of one path, once)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(
        status_code=401,
        detail="missing or wrong API token: send 'Authorization: Bearer <SLIDEDP_API_TOKEN>'",
        headers={"WWW-Authenticate": "Bearer"},
    )
