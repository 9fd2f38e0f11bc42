"""Helpers shared by the browser tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "frontend" / "dist"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("SLIDEDP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshot(pg, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    return path


def get_json(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def start_workbench(data: Path, env_extra: dict[str, str] | None = None) -> Iterator[str]:
    """`python -m slidedp_web.embedded` (SQLite, a private Redis, one local worker, the API and the UI) on a
    free loopback port with its own data directory; yields its URL once a worker has reported."""
    port = free_port()
    env = {**os.environ, "SLIDEDP_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for key in ("REDIS_URL", "DATABASE_URL", "SLIDEDP_API_TOKEN"):
        env.pop(key, None)
    env.update(env_extra or {})
    token = env.get("SLIDEDP_API_TOKEN")
    log = open(data / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "slidedp_web.embedded", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(data),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        health: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = get_json(url + "/api/health", token)
                if health.get("status") == "ok" and health.get("workers", 0) >= 1:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        if proc.poll() is not None or health.get("workers", 0) < 1:
            pytest.fail(
                f"the embedded workbench did not come up (health {health}):\n"
                + (data / "serve.log").read_text(errors="replace")[-4000:]
            )
        yield url
    finally:
        # Its worker and Redis run in their own sessions: note them now, so none outlives the test even if the
        # server's own shutdown misses one (a leaked worker would keep a core busy for the rest of the suite).
        import psutil

        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        # SIGTERM lets it stop its worker and its Redis.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for child in family:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        _, alive = psutil.wait_procs(family, timeout=20)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        log.close()
