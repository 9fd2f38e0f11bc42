"""A job that does not reach a step boundary within the cancel grace period is killed, rank processes and all."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest
from backend_support import make_settings, tiny_job, wait_for, wait_status
from fault_support import group_members, rank_pids


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(module_dir / "data", redis_server.url, cancel_grace_s=1.0)


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_cancel_kills_a_job_that_does_not_stop_within_the_grace_period(client, worker, dataset):
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    # A cancel before the attempt's first step ends it cleanly at once (there is nothing to lose yet), so the
    # kill path is only reached by a job that is already training.
    wait_for(
        lambda: client.get(f"/api/jobs/{job['id']}/metrics").json()["items"], 120, "the job's first step"
    )
    pid = int(
        wait_for(
            lambda: re.search(rf"job {job['id']} attempt 1: job process (\d+)", worker.log()),
            10,
            "the job's pid in the worker log",
        ).group(1)
    )
    ranks = rank_pids(pid)
    assert len(ranks) == 1, f"expected the job's one rank process in group {pid}, found {ranks}"
    try:
        # A frozen rank is a rank stuck inside a step (a hung collective, a stalled read): the job process
        # still passes the stop on, but no step boundary comes, so only the kill after the grace ends it.
        for rank in ranks:
            os.kill(rank, signal.SIGSTOP)
        assert client.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "running"
        done = wait_status(client, job["id"], ("cancelled", "failed", "completed"), timeout=60)
        assert done["status"] == "cancelled"
        assert done["error"]["message"] == "killed after not stopping within 1 s of the cancel"
        # Weaker for the rank than it looks: were only the job process killed, the kernel would still end the
        # stopped rank (SIGHUP to a process group orphaned with a stopped member).
        left = group_members(pid)
        assert not left, f"the job's process group (its rank processes) outlived the kill: {sorted(left)}"
        lines = [entry["line"] for entry in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
        assert "the job did not stop within 1 s: killing it" in lines
    finally:
        with contextlib.suppress(ProcessLookupError):
            if group_members(pid):  # the kill failed: do not leave a stopped rank behind
                os.killpg(pid, signal.SIGKILL)
