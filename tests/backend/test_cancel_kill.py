"""A job that does not reach a step boundary within the cancel grace period is killed, rank processes and all."""

from __future__ import annotations

import os
import re

import pytest
from backend_support import make_settings, tiny_job, wait_for, wait_status


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(module_dir / "data", redis_server.url, cancel_grace_s=1.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cancel_kills_a_job_that_does_not_stop_within_the_grace_period(client, worker, dataset):
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    wait_status(client, job["id"], ("running",))
    # Still starting (importing torch, spawning its rank): no step boundary comes within the 1 s grace.
    assert client.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "running"
    done = wait_status(client, job["id"], ("cancelled", "failed", "completed"), timeout=60)
    assert done["status"] == "cancelled"
    assert done["error"]["message"] == "killed after not stopping within 1 s of the cancel"
    pid = int(
        wait_for(
            lambda: re.search(rf"job {job['id']} attempt 1: job process (\d+)", worker.log()),
            10,
            "the job's pid in the worker log",
        ).group(1)
    )
    assert not _group_alive(pid), "the job's process group (its rank processes) outlived the kill"
    lines = [entry["line"] for entry in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
    assert "the job did not stop within 1 s: killing it" in lines
