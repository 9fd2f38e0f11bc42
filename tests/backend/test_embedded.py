"""`slidedp serve` (slidedp_web.embedded.main) as a real subprocess: private Redis on a unix socket, SQLite in
the data directory, one local worker, the API on the requested port; SIGTERM stops all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
from backend_support import alive, free_port, wait_for


def test_serve_starts_the_workbench_and_stops_everything(tmp_path):
    data = tmp_path / "data"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "SLIDEDP_API_TOKEN") and not k.startswith("SLIDEDP_")
    }
    env.update(SLIDEDP_DATA_DIR=str(data), SLIDEDP_HOST_REPORT_S="1", HF_HUB_OFFLINE="1")
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from slidedp_web.embedded import main; sys.exit(main(['--port', '{port}']))",
        ],
        env=env,
        cwd=str(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def health():
        try:
            body = httpx.get(f"{url}/api/health", timeout=2).json()
        except httpx.HTTPError:
            return None
        return body if body["workers"] == 1 else None

    try:
        body = wait_for(health, 90, "slidedp serve to answer with its worker online")
        wait_for(
            lambda: "ready." in (data / "worker.log").read_text(), 60, "the local worker to consume its queue"
        )
        assert body == {"status": "ok", "database": True, "redis": True, "workers": 1}
        assert (data / "slidedp.db").is_file() and (data / "redis.sock").exists()
        redis_pid = int((data / "redis.pid").read_text())
        assert alive(redis_pid)
        hosts = httpx.get(f"{url}/api/hosts").json()["items"]
        assert len(hosts) == 1 and hosts[0]["online"]
        assert "SlideDP Workbench at http://127.0.0.1:" in (tmp_path / "serve.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
    wait_for(lambda: not alive(redis_pid), 10, "the private redis-server to stop")
    assert not (data / "redis.sock").exists()
    assert "Warm shutdown" in (data / "worker.log").read_text()


def test_serve_uses_redis_url_and_database_url_when_set(tmp_path):
    """The machine's own Redis (127.0.0.1:6379) and a database file elsewhere: no private Redis is started."""
    import redis

    external = "redis://127.0.0.1:6379/11"
    try:
        redis.Redis.from_url(external, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        raise AssertionError(f"the external-Redis test needs a Redis at {external}: {exc}") from exc
    data, db_file = tmp_path / "data", tmp_path / "elsewhere" / "wb.db"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIDEDP_")}
    env.update(
        SLIDEDP_DATA_DIR=str(data),
        REDIS_URL=external,
        DATABASE_URL=f"sqlite:///{db_file}",
        SLIDEDP_HOST_NAME=f"serve-ext-{port}",
        HF_HUB_OFFLINE="1",
    )
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from slidedp_web.embedded import main; sys.exit(main(['--port', '{port}']))",
        ],
        env=env,
        cwd=str(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def health():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).json()
            except httpx.HTTPError:
                return None

        assert wait_for(health, 90, "slidedp serve to answer")["redis"] is True
        assert db_file.is_file() and not (data / "slidedp.db").exists()
        assert not (data / "redis.sock").exists() and not (data / "redis.pid").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_killed_serve_takes_its_redis_and_worker_with_it(tmp_path):
    data = tmp_path / "data"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("SLIDEDP_")
    }
    env.update(SLIDEDP_DATA_DIR=str(data), HF_HUB_OFFLINE="1")
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; from slidedp_web.embedded import main; sys.exit(main(['--port', '{port}']))",
            ],
            env=env,
            cwd=str(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (data / "worker.log").exists() and "ready." in (data / "worker.log").read_text(),
            90,
            "the local worker to be ready",
        )
        redis_pid = int((data / "redis.pid").read_text())
        # the worker by its command line, or by the title Celery gives its process when setproctitle is installed
        worker_pids = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-f", "-P", str(proc.pid), r"slidedp_web\.worker|celeryd: "], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(worker_pids) == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs in the killed process itself
        proc.wait(10)
    wait_for(
        lambda: not alive(redis_pid) and not alive(worker_pids[0]),
        30,
        "Redis and the worker to stop after their parent was killed",
    )
