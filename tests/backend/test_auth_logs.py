"""No secret reaches a log line of the API: the real server (slidedp serve --api-only, text and JSON logs, and a
plain `uvicorn slidedp_web.main:app`) with its output captured, asked with tickets, tokens and Authorization
headers; then the captured output is searched for them. Plus the redaction filter on records of every shape."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import httpx
import pytest
from backend_support import ROOT, free_port, wait_for
from slidedp_web import logs

TOKEN = "log-test-token-Zq81"
SECRETS = {
    "access_token": "accessSECRET-1a2b",
    "token": "tokenSECRET-3c4d",
    "ticket": "ticketSECRET-5e6f.x7y8",
    "bearer": "bearerSECRET-9g0h",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLIDEDP_", "DATABASE_URL", "REDIS_URL"))}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


COMMANDS = {
    "serve-text": lambda port: [sys.executable, "-m", "slidedp_web.embedded", "--api-only", "--host", "127.0.0.1",
                                "--port", str(port)],
    "serve-json": lambda port: [sys.executable, "-m", "slidedp_web.embedded", "--api-only", "--host", "127.0.0.1",
                                "--port", str(port)],
    "uvicorn": lambda port: [sys.executable, "-m", "uvicorn", "slidedp_web.main:app", "--host", "127.0.0.1",
                             "--port", str(port)],
}  # fmt: skip


@pytest.mark.parametrize("mode", sorted(COMMANDS))
def test_access_log_and_app_logs_hold_no_secrets(mode, tmp_path, redis_server):
    port = free_port()
    env = clean_env(
        SLIDEDP_DATA_DIR=str(tmp_path / "data"),
        REDIS_URL=redis_server.url,
        SLIDEDP_API_TOKEN=TOKEN,
        SLIDEDP_LOG_FORMAT="json" if mode == "serve-json" else "text",
    )
    out = tmp_path / "server.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            COMMANDS[mode](port), env=env, cwd=str(tmp_path), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/api/health", headers=auth, timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        wait_for(up, 60, "the API to answer")
        assert proc.poll() is None, out.read_text()[-3000:]
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.get(f"/api/jobs?access_token={SECRETS['access_token']}").status_code == 401
            assert c.get(f"/api/jobs?limit=5&token={SECRETS['token']}").status_code == 401
            assert c.get(f"/api/jobs/1/events?last_event_id=3&ticket={SECRETS['ticket']}").status_code == 401
            assert (
                c.get("/api/hosts", headers={"Authorization": f"Bearer {SECRETS['bearer']}"}).status_code
                == 401
            )
            assert c.get("/api/presets", headers=auth).status_code == 200
            # A real ticket, used: the access log shows the request, not the ticket.
            ticket = c.post("/api/tickets", json={"path": "/api/jobs/424242/export"}, headers=auth).json()[
                "ticket"
            ]
            assert c.get(f"/api/jobs/424242/export?ticket={ticket}").status_code == 404
            # The SPA fallback (outside /api) logs too.
            c.get(f"/jobs?access_token={SECRETS['access_token']}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.read_text(errors="replace")
    # The access log was captured: every request is there, with its secrets replaced.
    for line in (
        "/api/jobs?access_token=***",
        "/api/jobs?limit=5&token=***",
        "/api/jobs/1/events?last_event_id=3&ticket=***",
        "/api/jobs/424242/export?ticket=***",
        "/api/hosts",
        "/api/tickets",
    ):
        assert line in text, f"{line!r} not in the captured log:\n{text[-4000:]}"
    for secret in (*SECRETS.values(), ticket, ticket.split(".")[1], TOKEN):
        assert secret not in text, f"{secret!r} leaked into the log:\n{text[-4000:]}"
    if mode == "serve-json":
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        access = [r for r in records if r["logger"] == "uvicorn.access"]
        assert any(r["path"] == "/api/jobs/1/events" and r.get("job_id") == 1 for r in access), access
        assert any("ticket=***" in r["msg"] for r in access)


def record(msg, args=(), name="slidedp_web.test", exc_info=None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, exc_info)


def render(rec: logging.LogRecord, formatter: logging.Formatter | None = None) -> str:
    assert logs.RedactSecrets().filter(rec) is True  # never drops a record
    return (formatter or logging.Formatter("%(message)s")).format(rec)


@pytest.mark.parametrize(
    ("msg", "args"),
    [
        (
            '%s - "%s %s HTTP/%s" %d',
            ("127.0.0.1:5", "GET", "/api/jobs/3/events?ticket=S3CR3T&x=1", "1.1", 200),
        ),
        ("GET /api/jobs?access_token=S3CR3T", ()),
        ("GET %s?token=%s", ("/api/jobs", "S3CR3T")),  # split between the format and an argument
        ("headers: %r", ({"authorization": "Bearer S3CR3T", "accept": "*/*"},)),
        ("Authorization: Basic S3CR3T", ()),
        ("sent %(h)s", ({"h": "Authorization: Bearer S3CR3T"},)),
        ("retrying with bearer S3CR3T now", ()),
    ],
)
def test_redaction_of_records_of_every_shape(msg, args):
    text = render(record(msg, args))
    assert "S3CR3T" not in text and "***" in text, text


def test_redaction_keeps_access_log_fields_and_tracebacks():
    rec = record('%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", "/api/jobs/7/export?ticket=S3CR3T", "1.1", 200),
                 name="uvicorn.access")  # fmt: skip
    out = json.loads(render(rec, logs.JsonFormatter()))
    assert out["path"] == "/api/jobs/7/export" and out["job_id"] == 7 and out["status"] == 200
    assert "ticket=***" in out["msg"] and "S3CR3T" not in out["msg"]
    try:
        raise RuntimeError("GET http://x/api/jobs?access_token=S3CR3T failed")
    except RuntimeError:
        rec = record("request failed", exc_info=sys.exc_info())
    for formatter in (logging.Formatter("%(message)s"), logs.JsonFormatter()):
        text = render(rec, formatter)
        assert "S3CR3T" not in text and "access_token=***" in text
    # Nothing secret: unchanged, arguments and all.
    rec = record("job %d attempt %d: running", (7, 1))
    assert render(rec) == "job 7 attempt 1: running" and rec.args == (7, 1)
    assert (
        logs.redact("/api/jobs?status=running&next_token_hint=1")
        == "/api/jobs?status=running&next_token_hint=1"
    )


def test_install_redaction_reaches_uvicorn_and_root(tmp_path):
    """After uvicorn (re)configures its loggers, the access logger keeps its filter; root handlers get one."""
    code = f"""
import logging, logging.config, sys, uvicorn.config
sys.path.insert(0, {str(ROOT / "backend")!r})
from slidedp_web import logs
logs.install_redaction()
logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)   # what uvicorn does when it starts
logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "c", "GET", "/x?ticket=S3CR3T", "1.1", 200)
logs.configure("INFO", "text")
logging.getLogger("slidedp_web.any").warning("Authorization: Bearer S3CR3T")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both
    assert "/x?ticket=***" in both and "Authorization: Bearer ***" in both
    assert "S3CR3T" not in both, both
