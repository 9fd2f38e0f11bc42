"""Real parts for the backend tests: a private redis-server, the API served by uvicorn, a Celery worker process,
an SSE reader, and a tokens dataset for the tiny model (fixtures in conftest.py use these)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import httpx

ROOT = Path(__file__).resolve().parents[2]
TIMINGS = {  # shortened so failures and heartbeats show within a test's time
    "heartbeat_s": 0.5,
    "heartbeat_timeout_s": 6.0,
    "host_report_s": 1.0,
    "cancel_grace_s": 30.0,
    "watchdog_s": 0.5,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether a process with this id still exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class RedisServer:
    """redis-server on a free loopback port, no persistence; stop() and start() again on the same port."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (scripts/setup.sh installs Debian's)"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        def up() -> bool:
            try:
                return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
            except (redis.RedisError, OSError):
                return False

        wait_for(up, 15, "redis-server to answer")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)


class ApiServer:
    """The app of slidedp_web.main.create_app served by uvicorn in a thread, on a free loopback port."""

    def __init__(self, settings):
        import uvicorn
        from slidedp_web.main import create_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> ApiServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "the API to start")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class WorkerProcess:
    """`slidedp worker` (slidedp_web.worker.main) as a real process with the test's settings."""

    def __init__(self, settings, logfile: Path, name: Optional[str] = None, extra_env: Optional[dict] = None):
        env = {
            **os.environ,
            **settings.env(),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        env.pop("SLIDEDP_API_TOKEN", None)
        if name:
            env["SLIDEDP_HOST_NAME"] = name
            env["SLIDEDP_WORKER_QUEUE"] = f"slidedp-{name}"
        self.env, self.logfile = env, logfile
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> WorkerProcess:
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from slidedp_web.worker import main; sys.exit(main([]))"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(ROOT),
            )
        wait_for(lambda: "ready." in self.log() or self.proc.poll() is not None, 60, "the worker to be ready")
        assert self.proc.poll() is None, f"worker exited:\n{self.log()[-3000:]}"
        return self

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def read_sse(
    client: httpx.Client,
    url: str,
    *,
    headers: Optional[dict] = None,
    timeout: float = 120,
    stop: Optional[Callable[[list[dict]], bool]] = None,
) -> list[dict]:
    """Events of an SSE stream as [{"id", "event", "data"}] until it ends (or `stop(events)` is true)."""
    events: list[dict] = []
    current: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    with client.stream("GET", url, headers=headers or {}, timeout=httpx.Timeout(timeout, read=30)) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"SSE stream did not end within {timeout} s; got {events[-3:]}")
            if line == "":
                if "data" in current:
                    events.append(
                        {
                            "id": int(current["id"]) if "id" in current else None,
                            "event": current.get("event", "message"),
                            "data": json.loads(current["data"]),
                        }
                    )
                    if stop and stop(events):
                        return events
                current = {}
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            current[key] = value[1:] if value.startswith(" ") else value
    return events


def tokens_dataset(path: Path, rows: int = 64, seq_len: int = 32, vocab: int = 512, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"input_ids": [rng.randrange(3, vocab) for _ in range(seq_len)]}) + "\n")
    return path


def post_at_once(base_url: str, path: str, body: dict[str, Any], clients: int) -> list[int]:
    """The status codes of `clients` identical POSTs released together (one connection each)."""
    answers: list[int] = []
    barrier = threading.Barrier(clients)

    def send() -> None:
        with httpx.Client(base_url=base_url, timeout=60) as c:
            barrier.wait()
            answers.append(c.post(path, json=body).status_code)

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def tiny_job(dataset: Path, **overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "model": "tiny-qwen3",
        "data": {"path": str(dataset), "format": "tokens"},
        "gpus": 0,
        "ranks": 1,
        "seq_len": 32,
        "micro_batch_size": 2,
        "steps": 4,
        "precision": "fp32",
    }
    job.update(overrides)
    return job


def wait_status(client: httpx.Client, job_id: int, statuses: tuple[str, ...], timeout: float = 240) -> dict:
    """The job once its status is one of `statuses`. The default wait leaves room for a loaded machine: the same
    suite ran 1.6x slower on a loaded 2-core machine than on an idle one, where a wait of 120 s once ran out."""
    def current() -> Optional[dict]:
        job = client.get(f"/api/jobs/{job_id}").json()
        return job if job["status"] in statuses else None

    return wait_for(current, timeout, f"job {job_id} to become {' or '.join(statuses)}", interval=0.3)


def make_settings(data_dir: Path, redis_url: str, **overrides):
    from slidedp_web.core.config import Settings

    name = f"test-{uuid.uuid4().hex[:8]}"
    values = {
        "data_dir": data_dir,
        "redis_url": redis_url,
        "host_name": name,
        "database_url": None,
        **TIMINGS,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)
