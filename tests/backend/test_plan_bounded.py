"""No request pins the server through planning: the CPU demo at the largest grad_accum is planned like a short
one, a plan preview that runs past SLIDEDP_PLAN_TIMEOUT_S is stopped and answered 503 (POST /api/plan and
POST /api/jobs), and `slidedp serve` stops on the first Ctrl-C while a plan is being made.

The slow planner is real planning made slow in the server's own processes: a sitecustomize module on the
server's PYTHONPATH wraps slidedp.planning.autopolicy.plan_job so that it sleeps first and marks a file when it
starts (every interpreter the server starts, its planning processes included, imports it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from backend_support import alive, free_port, tiny_job, wait_for
from slidedp_web.presets import demo_config

SLOW_PLANNER = textwrap.dedent(
    """
    import os

    if os.environ.get("TEST_SLOW_PLAN_S"):
        import time

        from slidedp.planning import autopolicy

        real_plan_job = autopolicy.plan_job

        def slow_plan_job(*args, **kwargs):
            with open(os.environ["TEST_SLOW_PLAN_MARK"], "a") as fh:
                fh.write(f"{os.getpid()}\\n")
            time.sleep(float(os.environ["TEST_SLOW_PLAN_S"]))
            return real_plan_job(*args, **kwargs)

        autopolicy.plan_job = slow_plan_job
    """
)


def test_the_cpu_demo_with_the_largest_grad_accum_is_planned(client):
    """The reported request: the demo job at grad_accum 65536 gets its plan, a step 65536 micro-batches long."""
    small = client.post("/api/plan", json={**demo_config(), "grad_accum": 8})
    large = client.post("/api/plan", json={**demo_config(), "grad_accum": 65536}, timeout=60)
    assert small.status_code == 200 and large.status_code == 200, large.text
    a, b = small.json(), large.json()
    assert a["feasible"] and b["feasible"] and b["policy"]["window"] > 0
    if a["predicted"]["step_time_s"] is not None:  # timed where this host has calibrated the demo's shape
        assert b["predicted"]["step_time_s"] > 1000 * a["predicted"]["step_time_s"]


class SlowServer:
    """`slidedp serve --api-only` as a real process whose planner sleeps `slow_s` before planning."""

    def __init__(self, tmp_path: Path, slow_s: float, plan_timeout_s: float):
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SLOW_PLANNER)
        self.mark = tmp_path / "planning-started"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("SLIDEDP_")
        }
        env.update(
            SLIDEDP_DATA_DIR=str(tmp_path / "data"),
            SLIDEDP_PLAN_TIMEOUT_S=str(plan_timeout_s),
            REDIS_URL="redis://127.0.0.1:1/0",  # --api-only: planning needs no Redis
            PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]),
            TEST_SLOW_PLAN_S=str(slow_s),
            TEST_SLOW_PLAN_MARK=str(self.mark),
            HF_HUB_OFFLINE="1",
        )
        self.log = tmp_path / "serve.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"import sys; from slidedp_web.embedded import main; sys.exit(main(['--api-only', '--port', "
             f"'{self.port}']))"],
            env=env, cwd=str(tmp_path), stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def __enter__(self) -> SlowServer:
        def up() -> bool:
            try:
                return httpx.get(f"{self.url}/api/health", timeout=2).status_code in (200, 503)
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "slidedp serve --api-only to answer")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def post_in_background(self, path: str, body: dict) -> dict:
        """POST in a thread; the answer (or the error) lands in the returned dict."""
        out: dict = {}

        def send() -> None:
            try:
                out["response"] = httpx.post(f"{self.url}{path}", json=body, timeout=300)
            except httpx.HTTPError as exc:
                out["error"] = exc

        out["thread"] = threading.Thread(target=send, daemon=True)
        out["thread"].start()
        return out


@pytest.mark.parametrize("path", ["/api/plan", "/api/jobs"])
def test_a_plan_past_the_deadline_is_stopped_and_answered_503(tmp_path, dataset, path):
    with SlowServer(tmp_path, slow_s=600, plan_timeout_s=3) as server:
        started = time.monotonic()
        resp = httpx.post(f"{server.url}{path}", json=tiny_job(dataset), timeout=120)
        waited = time.monotonic() - started
        assert resp.status_code == 503, resp.text
        detail = resp.json()["detail"]
        assert "SLIDEDP_PLAN_TIMEOUT_S = 3 s" in detail and "stopped" in detail, detail
        assert waited < 60  # answered near the deadline, not after the 600 s the planner sleeps
        planners = [int(p) for p in server.mark.read_text().split()]
        assert planners and server.proc.pid not in planners  # planned in a process of its own ...
        wait_for(lambda: not any(alive(p) for p in planners), 10, "the planning process to be killed")  # ... killed
        if path == "/api/jobs":
            assert httpx.get(f"{server.url}/api/jobs").json()["total"] == 0  # nothing was created
        assert httpx.get(f"{server.url}/api/health", timeout=5).status_code in (200, 503)


def test_serve_stops_on_the_first_ctrl_c_while_a_plan_is_being_made(tmp_path, dataset):
    with SlowServer(tmp_path, slow_s=600, plan_timeout_s=600) as server:
        pending = server.post_in_background("/api/plan", tiny_job(dataset))
        wait_for(server.mark.exists, 60, "planning to start")
        os.kill(server.proc.pid, signal.SIGINT)  # once
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("slidedp serve was still running 30 s after one Ctrl-C, with a plan request in flight:\n"
                        + server.log.read_text(errors="replace")[-3000:])
        pending["thread"].join(10)
        resp = pending.get("response")
        assert resp is not None and resp.status_code == 503, pending
        assert "the server is stopping" in resp.json()["detail"]
        planners = [int(p) for p in server.mark.read_text().split()]
        wait_for(lambda: not any(alive(p) for p in planners), 10, "the planning process to be gone")

