"""Logs of the workbench's processes (API, worker, job process): plain lines by default, what `make run` prints,
or one JSON object per record with SLIDEDP_LOG_FORMAT=json, for a log collector:

    {"ts": "2026-11-29T19:50:41.203Z", "level": "INFO", "logger": "slidedp_web.tasks",
     "msg": "job 7 attempt 1: running", "job_id": 7}

`job_id` is there whenever the record concerns one job: records logged while a worker supervises a job (a context
variable set for the task), the job process's own lines, and the API's access log lines for /api/jobs/<id>/...
Exceptions add "exc" (the formatted traceback); access log lines add "method", "path" and "status".

Secrets never reach a log line of the API: RedactSecrets (on uvicorn's access logger and on the handlers of the
root and uvicorn loggers, see install_redaction) replaces the values of `ticket`, `token` and `access_token` query
parameters and of Authorization headers / bearer credentials with `***`, in either format:

    127.0.0.1:50312 - "GET /api/jobs/3/events?last_event_id=12&ticket=*** HTTP/1.1" 200
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any, Optional

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_JOB_PATH = re.compile(r"^/api/jobs/(\d+)(?:/|$)")
REDACTED = "***"
SECRET_QUERY_PARAMS = ("ticket", "token", "access_token")
_SECRET_QUERY = re.compile(r"(?i)([?&;](?:" + "|".join(SECRET_QUERY_PARAMS) + r")=)[^&;#\s\"']*")
# `Authorization: Bearer abc`, `'authorization': 'Basic abc'`, `authorization=abc`: keep the scheme, hide the rest.
_AUTH_HEADER = re.compile(
    r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token|digest)\s+)?[^\s\"',;}]+"
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]+")
_current_job: ContextVar[Optional[int]] = ContextVar("slidedp_job_id", default=None)
_json_enabled = False


@contextlib.contextmanager
def job_context(job_id: int) -> Iterator[None]:
    """Records logged inside (in this thread or task) carry this job_id."""
    token = _current_job.set(int(job_id))
    try:
        yield
    finally:
        _current_job.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, timezone.utc)
        out: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        job_id = getattr(record, "job_id", None) or _current_job.get()
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            _client, method, path, _version, status = record.args
            out.update(method=method, path=str(path).split("?")[0], status=status)
            match = _JOB_PATH.match(out["path"])
            if match and job_id is None:
                job_id = int(match.group(1))
        if job_id is not None:
            out["job_id"] = int(job_id)
        if record.exc_info:
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def redact(text: str) -> str:
    """`text` with the values of secret query parameters and Authorization credentials replaced by ***."""
    if not any(word in text.lower() for word in ("token", "ticket", "authorization", "bearer")):
        return text  # the common case, cheaply
    text = _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED, text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


class RedactSecrets(logging.Filter):
    """Rewrites a record so that no secret survives into any handler's output; never drops a record.

    String arguments are redacted one by one, which keeps uvicorn's access-log arguments (client, method, path,
    version, status) for the JSON formatter; if the formatted message still holds a secret (one split between
    the format and its arguments), the record is flattened to its redacted message. A traceback is formatted
    here, redacted, and left in exc_text, which formatters print instead of formatting it again.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.args, tuple):
                record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
            elif isinstance(record.args, dict):
                record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
            if isinstance(record.msg, str) and not record.args:
                record.msg = redact(record.msg)
            else:
                message = record.getMessage()
                clean = redact(message)
                if clean != message:
                    record.msg, record.args = clean, None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact(record.exc_text)
            if record.stack_info:
                record.stack_info = redact(record.stack_info)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted stays as it is
            pass
        return True


_redactor = RedactSecrets()


def install_redaction() -> None:
    """Put RedactSecrets where every line the API writes passes: uvicorn's access logger itself (a logger's
    filters survive uvicorn's dictConfig, which replaces handlers) and the handlers present now on the root and
    uvicorn loggers, plus Python's last-resort stderr handler. Idempotent; called again after uvicorn has set
    up its loggers (the app's startup) and whenever configure() replaces the root handler."""
    access = logging.getLogger("uvicorn.access")
    if _redactor not in access.filters:
        access.addFilter(_redactor)
    handlers = list(logging.getLogger().handlers)
    for name in UVICORN_LOGGERS:
        handlers.extend(logging.getLogger(name).handlers)
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if _redactor not in handler.filters:
            handler.addFilter(_redactor)


def log_format(value: Optional[str]) -> str:
    fmt = (value or "text").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"SLIDEDP_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {value!r}")
    return fmt


def configure(level: str | int = "INFO", fmt: Optional[str] = None) -> None:
    """One handler on the root logger (stderr) with the chosen format; JSON also for uvicorn's own loggers."""
    global _json_enabled
    fmt = log_format(fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    _json_enabled = fmt == "json"
    logging.captureWarnings(_json_enabled)  # Python warnings as records too, not as bare stderr lines
    if _json_enabled:
        use_json_for_uvicorn()
    install_redaction()


def use_json_for_uvicorn() -> None:
    """uvicorn configures its loggers with its own text formatters when it starts; switch them to JSON."""
    for name in UVICORN_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(JsonFormatter())


def json_enabled() -> bool:
    return _json_enabled


_job_log = logging.getLogger("slidedp_web.job")


def job_line(job_id: int, line: str) -> None:
    """A line of a job's own output on the process's log: a JSON record with its job_id, or `[job N] line`."""
    if _json_enabled:
        _job_log.info(line, extra={"job_id": job_id})
    else:
        print(f"[job {job_id}] {line}", flush=True)
