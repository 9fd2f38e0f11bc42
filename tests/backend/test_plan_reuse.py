"""Plan once per decision: the plan the API makes when a job is submitted (on its host's report) is the one the
worker's job process checks memory with and trains with, as long as the host the run sees is the one the plan was
made on; when it is not, the run plans again and the job's policy column says why (real API, real worker, tiny
model on the CPU)."""

from __future__ import annotations

import copy

import pytest
from backend_support import make_settings, tiny_job, wait_for, wait_status

pytestmark = pytest.mark.slow  # real jobs on a real worker: `make test`, not `make test-fast`

REUSED = "plan reused: this host and calibration are the ones it was made on"


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    # A calibration folder of its own: none is cached for the job's shape, as on a host that never calibrated.
    return make_settings(module_dir / "data", redis_server.url, calibration_dir=module_dir / "calibration")


def _lines(client, job_id: int) -> list[str]:
    return [e["line"] for e in client.get(f"/api/jobs/{job_id}/logs").json()["items"]]


def _reported(client, settings) -> dict:
    def topology():
        for host in client.get("/api/hosts").json()["items"]:
            if host["name"] == settings.host_name and (host.get("topology") or {}).get("cpu"):
                return host["topology"]
        return None

    return wait_for(topology, 60, "the worker to report its topology")


def _set_topology(settings, topology: dict) -> None:
    import sqlalchemy as sa
    from slidedp_web.core.db import write_session
    from slidedp_web.models import Host

    with write_session(settings) as session:
        session.execute(sa.update(Host).where(Host.name == settings.host_name).values(topology=topology))


def _calibrated(client, settings) -> dict:
    def calibration():
        for host in client.get("/api/hosts").json()["items"]:
            if host["name"] == settings.host_name and host.get("calibration"):
                return host["calibration"]
        return None

    return wait_for(calibration, 150, "the worker to report the calibration its first job made")


def test_the_first_job_on_a_host_calibrates_it_and_is_planned_again_saying_why(client, worker, dataset, settings):
    """A host with no calibration of the job's shape: the plan made at submit time has none, the run measures
    it (CPU jobs too), plans again with it, says why, and the worker reports the calibration for the next jobs."""
    _reported(client, settings)
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    planned = job["policy"]
    assert planned["stage"] == "planned" and planned["feasible"] is True
    assert planned["basis"]["topology"] and planned["basis"]["calibration"] is None
    done = wait_status(client, job["id"], ("completed", "failed"), timeout=180)
    assert done["status"] == "completed", done["error"]
    lines = _lines(client, job["id"])
    assert "re-planned: a calibration for this shape exists now" in lines and REUSED not in lines
    assert done["policy"]["basis"]["calibration"] is not None
    _calibrated(client, settings)


def test_the_worker_trains_with_the_plan_made_at_submit_time(client, worker, dataset, settings):
    _reported(client, settings)
    _calibrated(client, settings)  # the module's first job calibrated this shape on this host
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    planned = job["policy"]
    assert planned["stage"] == "planned" and planned["feasible"] is True
    assert planned["basis"]["topology"] and planned["basis"]["calibration"] is not None

    done = wait_status(client, job["id"], ("completed", "failed"), timeout=180)
    assert done["status"] == "completed", done["error"]
    lines = _lines(client, job["id"])
    assert REUSED in lines
    assert not any(line.startswith(("re-planned", "planner unavailable")) for line in lines), lines
    ran = done["policy"]
    assert ran["stage"] == "resolved" and ran["basis"] == planned["basis"] and ran.get("replanned") is None
    assert ran["why"] == planned["why"] and ran["policy"] == planned["policy"]


def test_a_job_planned_on_a_host_report_the_run_does_not_see_is_planned_again(client, worker, dataset, settings):
    real = _reported(client, settings)
    changed = copy.deepcopy(real)
    changed["cpu"]["cores"] = int(real["cpu"].get("cores") or 1) + 6
    _set_topology(settings, changed)
    try:
        job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
        planned = job["policy"]
        assert planned["stage"] == "planned" and planned["job"]["cpu_threads_per_rank"] == changed["cpu"]["cores"] - 1  # one core kept
        done = wait_status(client, job["id"], ("completed", "failed"), timeout=180)
    finally:
        _set_topology(settings, real)
    assert done["status"] == "completed", done["error"]
    why = "the host's CPU cores changed since the job was planned"
    lines = _lines(client, job["id"])
    assert f"re-planned: {why}" in lines and REUSED not in lines
    ran = done["policy"]
    assert ran["stage"] == "resolved" and ran["replanned"] == why
    assert ran["basis"]["topology"] != planned["basis"]["topology"]
    assert ran["job"]["cpu_threads_per_rank"] == max(1, real["cpu"]["cores"] - 1)  # planned on the host the run saw


def test_preflight_answers_memory_with_the_stored_plan_made_on_the_reported_topology(monkeypatch, tmp_path):
    """The job process's memory check plans only when the stored plan was made on another report."""
    from slidedp.config import JobConfig
    from slidedp.planning import autopolicy
    from slidedp_web.hosts import basic_topology
    from slidedp_web.preflight import preflight

    settings = make_settings(tmp_path / "data", "redis://127.0.0.1:1/0")
    topology = {**basic_topology(settings), "source": "slidedp.planning.topology", "cpu": {"cores": 2}}
    cfg = JobConfig.from_dict(tiny_job("demo:demo_sft.jsonl"))
    plan = autopolicy.plan_job(cfg, topology, None)
    refusal = [{"loc": "model", "msg": "host RAM too small (the stored plan's verdict)"}]
    stored = {**plan, "feasible": False, "errors": refusal, "stage": "planned"}
    calls = []
    real_plan_job = autopolicy.plan_job

    def counted(*args, **kwargs):
        calls.append(args)
        return real_plan_job(*args, **kwargs)

    monkeypatch.setattr(autopolicy, "plan_job", counted)
    assert preflight(settings, cfg, topology, None, stored) == refusal and calls == []
    assert preflight(settings, cfg, topology, None, plan) == [] and calls == []
    other = {**topology, "cpu": {"cores": 3}}
    assert preflight(settings, cfg, other, None, stored) == [] and len(calls) == 1  # planned on another report
    assert preflight(settings, cfg, topology, None, None) == [] and len(calls) == 2  # no stored plan
