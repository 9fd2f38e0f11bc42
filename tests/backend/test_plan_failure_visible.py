"""A job whose plan preview fails is accepted with the failure on it, never silently: its policy says
`"stage": "unplanned"` with the planner's error and a warning, in the REST answer the job page reads.

The failure is real: a host whose report holds a CPU section the planner cannot read (a report written by a
different worker version, say), so planning raises in the API's planning process."""

from __future__ import annotations

from backend_support import make_settings, tiny_job
from slidedp_web import hosts


def test_a_failed_plan_preview_is_kept_on_the_job(client, settings, dataset):
    garbled = make_settings(settings.data_dir, settings.redis_url, host_name="garbled-report")
    hosts.report(garbled, topology={"cpu": "not a section", "gpus": []}, started=True)

    preview = client.post("/api/plan", json={**tiny_job(dataset), "host": "garbled-report"})
    assert preview.status_code == 422, preview.text
    assert "cannot plan this job: AttributeError" in preview.text

    resp = client.post("/api/jobs", json={**tiny_job(dataset), "host": "garbled-report"})
    assert resp.status_code == 201, resp.text
    job = client.get(f"/api/jobs/{resp.json()['id']}").json()
    policy = job["policy"]
    assert policy["stage"] == "unplanned", policy
    assert policy["plan_error"].startswith("AttributeError: "), policy
    [warning] = policy["warnings"]
    assert warning["loc"] == "policy" and policy["plan_error"] in warning["msg"], warning
    client.delete(f"/api/jobs/{job['id']}")
