"""Dependencies of the API routes: settings, a database session, the bearer-token check."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from sqlmodel import Session

from slidedp_web.core.config import Settings
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


def require_token(request: Request, settings: SettingsDep) -> None:
    """With SLIDEDP_API_TOKEN set, every /api request carries `Authorization: Bearer <token>`.

    `?access_token=` is accepted too, because a browser's EventSource and a download link cannot set headers.
    """
    expected = settings.api_token
    if not expected:
        return
    header = request.headers.get("authorization", "")
    given = (
        header[7:].strip() if header[:7].lower() == "bearer " else request.query_params.get("access_token")
    )
    if not given or not secrets.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(
            status_code=401,
            detail="missing or wrong API token: send 'Authorization: Bearer <SLIDEDP_API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
