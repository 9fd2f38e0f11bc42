"""Logs of the workbench's processes (API, worker, job process): plain lines by default, what `make run` prints,
or one JSON object per record with SLIDEDP_LOG_FORMAT=json, for a log collector:

    {"ts": "2026-11-29T19:50:41.203Z", "level": "INFO", "logger": "slidedp_web.tasks",
     "msg": "job 7 attempt 1: running", "job_id": 7}

`job_id` is there whenever the record concerns one job: records logged while a worker supervises a job (a context
variable set for the task), the job process's own lines, and the API's access log lines for /api/jobs/<id>/...
Exceptions add "exc" (the formatted traceback); access log lines add "method", "path" and "status".
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
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


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
