"""The API's ASGI middleware: what is refused before a route runs.

* **Request size.** Bodies above SLIDEDP_MAX_REQUEST_BYTES are refused with 413 before they are read; a job config
  is a few kilobytes, and nothing else is uploaded.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestSizeLimit:
    """ASGI middleware: 413 for a request body larger than `max_bytes`.

    A declared Content-Length is refused before anything is read; a chunked body is counted as it arrives and
    refused as soon as it passes the limit (the route reading it gets the 413 instead of the body)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, int(max_bytes)

    def detail(self, size: Optional[int]) -> str:
        got = f"{size} bytes" if size is not None else f"more than {self.max_bytes} bytes"
        return (
            f"request body too large: {got}, at most {self.max_bytes} bytes are accepted "
            "(SLIDEDP_MAX_REQUEST_BYTES). A job config is a few kilobytes: send the config, and name the model "
            "and dataset by their paths on the worker host."
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
        if declared is not None and declared > self.max_bytes:
            await _json_response(send, 413, {"detail": self.detail(declared)})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self.detail(None))
            return message

        await self.app(scope, counted, send)


async def _json_response(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
