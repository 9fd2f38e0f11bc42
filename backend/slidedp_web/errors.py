"""The refusals the workbench's services raise, in their own words and without the web framework.

A service (jobs, generations, planning, outputs, live) says what is wrong with a Refused subclass carrying the
answer's `detail`: a sentence, or for Unprocessable and Conflict one item per field, {"loc": ["body", key...],
"msg", "type"} (docs/interfaces.md, Errors). The API answers each with its status and the body {"detail": detail}
(slidedp_web.main registers the one handler), so a service can also run where there is no HTTP at all.
"""

from __future__ import annotations

from typing import Any, Union

Detail = Union[str, list[dict[str, Any]]]


class Refused(Exception):
    """A request the workbench will not carry out; `status` is the HTTP answer the API gives it."""

    status = 400

    def __init__(self, detail: Detail):
        super().__init__(detail)
        self.detail = detail


class NotFound(Refused):
    """No such job or generation."""

    status = 404


class Conflict(Refused):
    """The job's state, or a folder another job owns, does not allow this now."""

    status = 409


class Unprocessable(Refused):
    """A bad request field, each named by its key path: detail is [{"loc", "msg", "type"}]."""

    status = 422


class TooMany(Refused):
    """A queue is full (jobs, or a job's prompts): wait for some to run."""

    status = 429


class Unavailable(Refused):
    """A service the request needs (Redis, planning) is not there now; nothing was changed."""

    status = 503


BY_STATUS: dict[int, type[Refused]] = {c.status: c for c in (NotFound, Conflict, Unprocessable, TooMany, Unavailable)}


def refused(status: int, detail: Detail) -> Refused:
    """The refusal whose answer is `status` (a service that learns the status from elsewhere, as generations'
    Unusable does)."""
    cls = BY_STATUS.get(status)
    if cls is not None:
        return cls(detail)
    out = Refused(detail)
    out.status = status
    return out
