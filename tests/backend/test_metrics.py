"""Prometheus metrics at GET /metrics, read from the database and Redis at each scrape: jobs by status, queue
lengths, online workers, and the step, step time, tokens/s and loss of running jobs, equal to the job's newest
metrics record. Behind the API token when one is set."""

from __future__ import annotations

import httpx
import pytest
from backend_support import ApiServer, make_settings, read_sse, tiny_job, wait_for, wait_status
from fault_support import metric_steps, scrape


def by_status(seen: dict) -> dict[str, float]:
    return {dict(labels)["status"]: v for (name, labels), v in seen.items() if name == "slidedp_jobs"}


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_metrics_report_jobs_queues_workers_and_running_jobs(client, worker, settings, dataset):
    running = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    read_sse(client, f"/api/jobs/{running['id']}/events", stop=lambda ev: len(metric_steps(ev)) >= 3)
    waiting = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    dropped = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    assert client.post(f"/api/jobs/{dropped['id']}/cancel").json()["status"] == "cancelled"

    seen = scrape(client)
    assert by_status(seen) == {
        "queued": 1,
        "running": 1,
        "completed": 0,
        "failed": 0,
        "cancelled": 1,
        "interrupted": 0,
    }
    # Two run messages wait on the host's queue: the queued job's and the cancelled one's (dropped on delivery).
    assert seen[("slidedp_queue_length", (("queue", settings.queue),))] == 2
    assert seen[("slidedp_workers_online", ())] == 1
    assert seen[("slidedp_redis_up", ())] == 1 and seen[("slidedp_database_up", ())] == 1

    key = (("host", settings.host_name), ("job_id", str(running["id"])))
    step = int(seen[("slidedp_job_step", key)])
    assert step >= 3 and seen[("slidedp_job_steps", key)] == 100_000
    [record] = client.get(f"/api/jobs/{running['id']}/metrics?after_step={step - 1}&limit=1").json()["items"]
    assert record["step"] == step
    assert seen[("slidedp_job_step_time_seconds", key)] == record["step_time_s"] > 0
    assert seen[("slidedp_job_tokens_per_second", key)] == record["tokens_per_s"] > 0
    assert seen[("slidedp_job_loss", key)] == record["loss"]
    assert [
        k for k in seen if k[0].startswith("slidedp_job_") and ("job_id", str(waiting["id"])) in k[1]
    ] == []

    client.post(f"/api/jobs/{running['id']}/cancel")
    wait_status(client, running["id"], ("cancelled",), timeout=30)
    wait_status(client, waiting["id"], ("completed",), timeout=120)
    after = scrape(client)
    assert by_status(after)["running"] == 0 and by_status(after)["completed"] == 1
    assert by_status(after)["cancelled"] == 2
    assert not [k for k in after if k[0] == "slidedp_job_step"]  # no running job, no per-job series
    queue = ("slidedp_queue_length", (("queue", settings.queue),))
    wait_for(
        lambda: scrape(client)[queue] == 0, 30, "the worker to take the cancelled job's message and drop it"
    )


def test_metrics_need_the_api_token_when_one_is_set(module_dir, redis_server):
    settings = make_settings(module_dir / "data-token", redis_server.url, api_token="s3cret")
    with ApiServer(settings) as api:
        assert httpx.get(api.url + "/metrics").status_code == 401
        resp = httpx.get(api.url + "/metrics", headers={"Authorization": "Bearer s3cret"})
        assert resp.status_code == 200 and "slidedp_jobs{" in resp.text
