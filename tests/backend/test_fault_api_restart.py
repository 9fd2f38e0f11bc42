"""The API process killed and started again while a job trains: an SSE client that reconnects with Last-Event-ID
gets every event exactly once, those written while no API was up included. The same processes run with
SLIDEDP_LOG_FORMAT=json, and their logs are JSON records (ts, level, logger, msg) carrying the job's id."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from backend_support import WorkerProcess, make_settings, read_sse, tiny_job, wait_status
from fault_support import ApiProcess, metric_steps, statuses, stream_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]  # each runs well under 90 s; a hang fails fast
STEPS = 40
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(module_dir / "data", redis_server.url, log_format="json")


@pytest.fixture(scope="module")
def api_process(settings, module_dir):
    with ApiProcess(settings, module_dir / "api.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def json_worker(settings, module_dir, api_process):
    worker = WorkerProcess(settings, module_dir / "worker.log").start()
    yield worker
    worker.stop()


def test_sse_client_reconnecting_after_an_api_restart_misses_nothing(api_process, json_worker, dataset):
    with httpx.Client(base_url=api_process.url, timeout=30) as client:
        job = client.post("/api/jobs", json=tiny_job(dataset, steps=STEPS)).json()
        url = f"/api/jobs/{job['id']}/events"
        before: list[dict] = []
        try:
            for event in stream_events(client, url, timeout=150):
                before.append(event)
                if len(metric_steps(before)) == 3:
                    api_process.kill()  # SIGKILL: the connection dies with it
        except httpx.HTTPError:
            pass
        assert api_process.proc.poll() is not None
        assert metric_steps(before)[-1] < STEPS, "the job ended before the API was killed"
        down_at = metric_steps(before)[-1]
        time.sleep(2)  # the job trains on with no API up

        api_process.start()  # same port, a fresh process
        after = read_sse(client, url, headers={"Last-Event-ID": str(before[-1]["id"])}, timeout=150)
        done = client.get(f"/api/jobs/{job['id']}").json()

    events = before + after
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))  # no gap, no repeat
    assert statuses(events) == ["queued", "running", "completed"]
    assert metric_steps(events) == list(range(1, STEPS + 1))
    assert (done["status"], done["step"]) == ("completed", STEPS)
    assert metric_steps(after)[0] == down_at + 1


def json_records(text: str) -> tuple[list[dict], list[str]]:
    records, plain = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            plain.append(line)
    return records, plain


def test_api_and_worker_log_json_records_with_the_job_id(api_process, json_worker, dataset):
    with httpx.Client(base_url=api_process.url, timeout=30) as client:
        job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
        wait_status(client, job["id"], ("completed",))
        assert client.get(f"/api/jobs/{job['id']}/logs").status_code == 200
        lines = [e["line"] for e in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
    time.sleep(1)  # the last records reach the files

    api, plain = json_records(api_process.log())
    assert plain == [], plain[:5]  # uvicorn's own lines too, from the first one
    assert api and all({"ts", "level", "logger", "msg"} <= set(r) for r in api)
    assert all(TS.match(r["ts"]) for r in api)
    assert any(r["logger"] == "uvicorn.error" and r["msg"].startswith("Started server process") for r in api)
    access = [
        r for r in api if r["logger"] == "uvicorn.access" and r.get("path") == f"/api/jobs/{job['id']}/logs"
    ]
    assert access and access[-1]["job_id"] == job["id"]
    assert (access[-1]["method"], access[-1]["status"]) == ("GET", 200)

    worker, plain = json_records(json_worker.log())
    # Only the rank processes' own stderr (library warnings) is not the worker's to format.
    assert not [line for line in plain if "celery" in line.lower() or "slidedp" in line.lower()], plain[:10]
    assert all({"ts", "level", "logger", "msg"} <= set(r) and TS.match(r["ts"]) for r in worker)
    mine = [r for r in worker if r.get("job_id") == job["id"]]
    # the supervisor's records: the attempt's start (tasks) and its recorded outcome (outcome)
    supervised = [r["msg"] for r in mine if r["logger"] in ("slidedp_web.tasks", "slidedp_web.outcome")]
    assert f"job {job['id']} attempt 1: running" in supervised
    assert f"job {job['id']} attempt 1: completed" in supervised
    own = [r["msg"] for r in mine if r["logger"] == "slidedp_web.job"]
    assert own == lines  # the job's lines, as stored for GET /logs
    assert any("step     2/2" in m for m in own)
    assert any(r["msg"].endswith("ready.") for r in worker)  # Celery's own records are JSON too
