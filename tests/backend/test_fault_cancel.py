"""Cancel of the tiny CPU job takes effect within 10 s, measured from the cancel request to status `cancelled`:
while it trains (it stops at the next step boundary, with or without a checkpoint) and while it is still starting
(importing torch, spawning its rank: the first step boundary comes, or the grace period's kill does)."""

from __future__ import annotations

import time

import pytest
from backend_support import read_sse, tiny_job, wait_status
from fault_support import metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]  # each runs well under 90 s; a hang fails fast
BOUND_S = 10.0


def cancel_and_time(client, job_id: int, save: bool) -> tuple[dict, float]:
    started = time.monotonic()
    resp = client.post(f"/api/jobs/{job_id}/cancel", json={"save": save})
    assert resp.status_code == 200, resp.text
    done = wait_status(client, job_id, ("cancelled", "failed", "completed"), timeout=60)
    return done, time.monotonic() - started


@pytest.mark.parametrize("save", [False, True], ids=["stop", "save"])
def test_cancel_of_a_training_job_takes_effect_within_10_s(client, worker, dataset, save):
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    read_sse(client, f"/api/jobs/{job['id']}/events", stop=lambda ev: len(metric_steps(ev)) >= 2)
    done, took = cancel_and_time(client, job["id"], save)
    assert done["status"] == "cancelled" and done["error"] is None, done
    assert took < BOUND_S, f"cancel took {took:.1f} s"
    assert done["checkpoints"] == ([f"step-{done['step']:08d}"] if save else [])


def test_cancel_of_a_starting_job_takes_effect_within_10_s(client, worker, dataset):
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    wait_status(client, job["id"], ("running",), timeout=60)
    assert client.get(f"/api/jobs/{job['id']}/metrics").json()["items"] == []  # no step yet
    done, took = cancel_and_time(client, job["id"], save=False)
    assert (done["status"], done["error"], done["step"]) == ("cancelled", None, 0), done
    assert took < BOUND_S, f"cancel took {took:.1f} s"
    lines = [e["line"] for e in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
    assert "stopped before the first step of this attempt" in lines
