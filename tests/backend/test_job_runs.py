"""Jobs submitted over REST run on a real Celery worker with the real runtime (tiny model, CPU): metrics arrive
over SSE, cancel stops at a step boundary, resume continues from the checkpoint, duplicates are dropped."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from backend_support import make_settings, read_sse, tiny_job, wait_for, wait_status

METRIC_KEYS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "clipped",
    "step_time_s",
    "tokens_per_s",
    "tflops",
    "mfu",
    "hbm_peak_gib",
    "host_rss_gib",
    "data_time_s",
    "phases",
    "predicted",
}


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(module_dir / "data", redis_server.url, calibration_dir=module_dir / "calibration")


def statuses(events: list[dict]) -> list[str]:
    return [e["data"]["status"] for e in events if e["event"] == "status"]


def metric_steps(events: list[dict]) -> list[int]:
    return [e["data"]["step"] for e in events if e["event"] == "metrics"]


def test_submitted_job_runs_and_streams_metrics_until_completed(client, worker, dataset, settings):
    resp = client.post("/api/jobs", json={**tiny_job(dataset, checkpoint={"interval": 2}), "name": "tiny"})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert (job["status"], job["name"], job["steps"], job["step"]) == ("queued", "tiny", 4, 0)
    assert (job["stage"], job["cancel_request"], job["cancel_requested_at"]) == (None, None, None)
    assert job["output_dir"] == str(settings.jobs_dir / str(job["id"]))
    assert job["config"]["optimizer"]["lr"] == 1e-5  # stored with defaults filled in

    events = read_sse(client, f"/api/jobs/{job['id']}/events", timeout=120)
    assert statuses(events) == ["queued", "running", "completed"]
    assert metric_steps(events) == [1, 2, 3, 4]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))  # gap-free, increasing
    assert all(METRIC_KEYS <= set(e["data"]) for e in events if e["event"] == "metrics")
    logs = [e["data"] for e in events if e["event"] == "log"]
    assert [entry["seq"] for entry in logs] == list(range(1, len(logs) + 1))
    assert any("step     4/4" in entry["line"] for entry in logs)
    stages = [e["data"]["stage"] for e in events if e["event"] == "stage" and "progress" not in e["data"]]
    assert stages[0] == "preparing" and stages[-1] == "training", stages
    assert [s for s in stages if s in ("planning", "building_host_state", "starting_ranks", "first_step")] == [
        "planning", "building_host_state", "starting_ranks", "first_step"]

    done = client.get(f"/api/jobs/{job['id']}").json()
    assert (done["status"], done["step"], done["host"]) == ("completed", 4, settings.host_name)
    assert done["last_metrics"]["step"] == 4 and done["tokens_per_s"] > 0 and done["eta_s"] is None
    assert done["started_at"] <= done["finished_at"]
    assert done["checkpoints"] == ["step-00000002", "step-00000004"]
    assert done["stage"]["stage"] == "training" and done["stage"]["total_s"] > 0
    assert set(done["stage"]["durations"]) >= {"planning", "building_host_state", "starting_ranks", "first_step"}
    assert done["last_metrics"]["step"] == 4 and "startup_s" not in done["last_metrics"]

    metrics = client.get(f"/api/jobs/{job['id']}/metrics").json()["items"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics == [e["data"] for e in events if e["event"] == "metrics"]
    assert [m["step"] for m in client.get(f"/api/jobs/{job['id']}/metrics?after_step=2").json()["items"]] == [
        3,
        4,
    ]
    assert client.get(f"/api/jobs/{job['id']}/logs").json()["items"] == logs
    assert client.get(f"/api/jobs/{job['id']}/logs?after_seq=2").json()["items"] == logs[2:]

    ckpts = client.get(f"/api/jobs/{job['id']}/checkpoints").json()["items"]
    assert [(c["name"], c["step"]) for c in ckpts] == [("step-00000002", 2), ("step-00000004", 4)]
    assert all(c["bytes"] > 0 and Path(c["path"]).is_dir() for c in ckpts)

    # A reconnecting client (Last-Event-ID header or query) gets exactly the events after the one it saw.
    k = events[len(events) // 2]["id"]
    assert read_sse(client, f"/api/jobs/{job['id']}/events", headers={"Last-Event-ID": str(k)}) == events[k:]
    assert read_sse(client, f"/api/jobs/{job['id']}/events?last_event_id={k}") == events[k:]
    # Past the end of an ended job: 204, which stops a browser's EventSource from reconnecting.
    ended = client.get(f"/api/jobs/{job['id']}/events", headers={"Last-Event-ID": str(events[-1]["id"])})
    assert ended.status_code == 204

    export = client.get(f"/api/jobs/{job['id']}/export")
    assert export.status_code == 200 and export.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(export.content), mode="r:gz") as tar:
        names = set(tar.getnames())
    prefix = f"slidedp-job-{job['id']}"
    assert {f"{prefix}/config.json", f"{prefix}/model.safetensors"} <= names

    listed = client.get("/api/jobs?status=completed").json()
    assert listed["total"] >= 1 and job["id"] in [j["id"] for j in listed["items"]]
    assert client.delete(f"/api/jobs/{job['id']}").status_code == 204
    assert client.get(f"/api/jobs/{job['id']}").status_code == 404
    assert not Path(done["output_dir"]).exists()


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_a_diverged_job_fails_with_its_reason_and_a_sick_one_carries_its_warnings(client, worker, dataset):
    """Run health over REST: lr 1e30 makes step 2's loss non-finite (failed, `diverged: ...`, no export, the
    checkpoint of step 1 kept); a loss-spike factor barely above 1 turns ordinary noise into warnings, which the
    job keeps and the stream sends as `warning` events after the step's metrics."""
    bad = client.post("/api/jobs", json=tiny_job(dataset, optimizer={"lr": 1e30}, checkpoint={"interval": 1}))
    assert bad.status_code == 201, bad.text
    done = wait_status(client, bad.json()["id"], ("failed", "completed"))
    assert done["status"] == "failed", done
    assert done["error"]["message"].startswith("diverged: ") and "at step 2" in done["error"]["message"]
    assert done["error"]["errors"][0]["loc"] == "health"
    assert (done["error"]["reason"], done["error"]["step"]) == ("diverged", 2)
    assert done["checkpoints"] == ["step-00000001"]
    metrics = client.get(f"/api/jobs/{done['id']}/metrics").json()["items"]
    assert [m["step"] for m in metrics] == [1, 2] and metrics[1]["diverged"] == done["error"]["message"]
    assert client.get(f"/api/jobs/{done['id']}/export").status_code in (404, 409)

    sick = client.post("/api/jobs", json=tiny_job(dataset, optimizer={"lr": 0.5}, steps=6,
                                                     health={"loss_spike_factor": 1.01}))
    assert sick.status_code == 201, sick.text
    events = read_sse(client, f"/api/jobs/{sick.json()['id']}/events", timeout=120)
    assert statuses(events)[-1] == "completed"
    warned = [e["data"] for e in events if e["event"] == "warning"]
    job = client.get(f"/api/jobs/{sick.json()['id']}").json()
    assert warned and job["warnings"] == warned
    assert all(w["kind"] == "loss_spike" and w["message"] for w in warned)
    order = [(e["event"], e["data"].get("step")) for e in events if e["event"] in ("metrics", "warning")]
    for w in warned:  # each warning right after its step's metrics
        assert order[order.index(("warning", w["step"])) - 1] == ("metrics", w["step"])


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_duplicate_queue_message_never_runs_a_job_twice(client, worker, dataset, settings, redis_server):
    from slidedp_web.celery_app import enqueue

    job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    wait_status(client, job["id"], ("completed",))
    before = read_sse(client, f"/api/jobs/{job['id']}/events")
    enqueue(settings, job["id"], 1, settings.queue)  # a redelivered copy of the same attempt
    wait_for(lambda: "duplicate or stale delivery ignored" in worker.log(), 30, "the worker to drop the copy")
    assert redis_server.client().llen(settings.queue) == 0
    assert read_sse(client, f"/api/jobs/{job['id']}/events") == before
    assert statuses(before) == ["queued", "running", "completed"]


@pytest.mark.slow
def test_cancel_stops_a_running_job_at_a_step_boundary_and_a_queued_one_at_once(client, worker, dataset):
    long_job = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    waiting = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    first = read_sse(client, f"/api/jobs/{long_job['id']}/events", stop=lambda ev: bool(metric_steps(ev)))
    assert metric_steps(first) == [1]

    cancelled = client.post(f"/api/jobs/{waiting['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    resp = client.post(f"/api/jobs/{long_job['id']}/cancel", json={"save": False})
    assert resp.status_code == 200 and resp.json()["status"] == "running"
    # The pending cancel is on the job, so a page opened now says so.
    assert resp.json()["cancel_request"] == "stop" and resp.json()["cancel_requested_at"].endswith("Z")

    rest = read_sse(
        client,
        f"/api/jobs/{long_job['id']}/events",
        headers={"Last-Event-ID": str(first[-1]["id"])},
        timeout=60,
    )
    assert statuses(first + rest) == ["queued", "running", "cancelled"]
    done = client.get(f"/api/jobs/{long_job['id']}").json()
    assert 1 <= done["step"] < 100_000 and done["step"] == metric_steps(first + rest)[-1]
    assert done["checkpoints"] == [] and done["error"] is None
    assert (done["cancel_request"], done["cancel_requested_at"]) == (None, None)
    assert client.post(f"/api/jobs/{long_job['id']}/cancel").status_code == 409

    # The queued job's message reaches the worker later and is dropped: it never ran.
    time.sleep(2)
    assert statuses(read_sse(client, f"/api/jobs/{waiting['id']}/events")) == ["queued", "cancelled"]
    assert client.get(f"/api/jobs/{waiting['id']}/metrics").json()["items"] == []


@pytest.mark.slow
def test_cancel_with_save_then_resume_continues_from_the_checkpoint(client, worker, dataset):
    steps = 300
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=steps)).json()
    first = read_sse(client, f"/api/jobs/{job['id']}/events", stop=lambda ev: bool(metric_steps(ev)))
    assert client.post(f"/api/jobs/{job['id']}/cancel", json={"save": True}).status_code == 200
    rest = read_sse(client, f"/api/jobs/{job['id']}/events", headers={"Last-Event-ID": str(first[-1]["id"])})
    stopped = client.get(f"/api/jobs/{job['id']}").json()
    assert stopped["status"] == "cancelled", stopped
    saved = stopped["step"]
    assert 1 <= saved < steps
    assert stopped["checkpoints"] == [f"step-{saved:08d}"]

    resumed = client.post(f"/api/jobs/{job['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    assert resumed.json()["stage"] is None  # the new attempt reports its own start-up
    seen = first[-1]["id"] if not rest else rest[-1]["id"]
    after = read_sse(
        client, f"/api/jobs/{job['id']}/events", headers={"Last-Event-ID": str(seen)}, timeout=240
    )
    assert statuses(after) == ["queued", "running", "completed"]
    assert metric_steps(after) == list(range(saved + 1, steps + 1))  # continues, does not start over
    done = client.get(f"/api/jobs/{job['id']}").json()
    assert (done["status"], done["step"]) == ("completed", steps)
    all_steps = [m["step"] for m in client.get(f"/api/jobs/{job['id']}/metrics").json()["items"]]
    assert all_steps == list(range(1, steps + 1))
    assert any(
        "resuming from the newest checkpoint" in line["line"]
        for line in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]
    )
    assert client.post(f"/api/jobs/{job['id']}/resume").status_code == 409  # completed jobs are final


def test_worker_reports_its_host_topology(client, worker, settings):
    hosts = {h["name"]: h for h in client.get("/api/hosts").json()["items"]}
    host = hosts[settings.host_name]
    assert host["online"] is True and host["queue"] == settings.queue
    assert host["topology"]["schema"] == 1 and isinstance(host["topology"]["gpus"], list)
    assert host["topology"]["host_ram"]["limit_bytes"] > 0
    health = client.get("/api/health").json()
    assert health["status"] == "ok" and health["workers"] >= 1


def test_plan_preview_uses_the_calibration_the_host_reported(client, worker, settings, dataset, module_dir):
    # a shape no job of this module runs (each run calibrates its own shape, and the worker reports it)
    job = tiny_job(dataset, host=settings.host_name, micro_batch_size=3)
    before = client.post("/api/plan", json=job).json()
    assert before["feasible"] is True and before["calibration"] == "missing"
    assert before["predicted"]["step_time_s"] is None and before["validation"] == []

    # Calibrate this host at the job's shape with the runtime's own tool, as `slidedp plan` would.
    spec = module_dir / "calib-job.json"
    spec.write_text(json.dumps({k: v for k, v in job.items() if k != "host"}))
    env = {**os.environ, "SLIDEDP_CACHE_DIR": str(settings.calibration_path)}
    done = subprocess.run(
        [sys.executable, "-m", "slidedp.planning.calibration", str(spec), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]

    calibration = wait_for(lambda: reported_entry(client, settings, micro_batch=3), 30,
                           "the worker to report the calibration")
    assert calibration["shape"]["micro_batch"] == 3
    after = client.post("/api/plan", json=job).json()
    assert after["calibration"] == "measured" and after["predicted"]["step_time_s"] > 0
    assert after["host"] == settings.host_name
    other_shape = client.post("/api/plan", json={**job, "micro_batch_size": 5}).json()
    assert other_shape["calibration"] == "missing"  # measured at another shape: not used


def reported_entry(client, settings, **shape) -> dict | None:
    """The calibration entry of that shape that the worker's host reported (None: not yet)."""
    host = next(h for h in client.get("/api/hosts").json()["items"] if h["name"] == settings.host_name)
    for entry in (host["calibration"] or {}).get("entries") or []:
        if all(entry["shape"].get(k) == v for k, v in shape.items()):
            return entry
    return None


@pytest.mark.slow
def test_a_cpu_job_calibrates_its_host_and_the_host_reports_it(client, worker, settings, dataset):
    """A CPU job's run calibrates the worker's host at its shape (cached where the worker reports from): the
    job's records carry a predicted step time, /api/hosts carries the calibration, and the plan preview of the
    next job of that shape predicts times."""
    job = tiny_job(dataset, host=settings.host_name, micro_batch_size=1)
    before = client.post("/api/plan", json=job).json()
    assert before["calibration"] == "missing" and before["predicted"]["step_time_s"] is None
    created = client.post("/api/jobs", json=job)
    assert created.status_code == 201, created.text
    done = wait_status(client, created.json()["id"], ("completed", "failed"))
    assert done["status"] == "completed", done
    metrics = client.get(f"/api/jobs/{done['id']}/metrics").json()["items"]
    assert metrics and all(m["predicted"]["step_time_s"] > 0 for m in metrics)
    entry = wait_for(lambda: reported_entry(client, settings, micro_batch=1), 30, "the host to report the calibration")
    assert entry["device"] == "cpu" and entry["shape"]["model"] == "tiny-qwen3" and entry["unit"]["fwd_keep_s"] > 0
    after = client.post("/api/plan", json=job).json()
    assert after["calibration"] == "measured" and after["predicted"]["step_time_s"] > 0


def test_job_that_cannot_fit_the_reported_host_is_422(client, worker, settings, dataset):
    resp = client.post("/api/jobs", json=tiny_job(dataset, gpus=8, host=settings.host_name))
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["body", "gpus"]
    assert "GPUs" in resp.json()["detail"][0]["msg"]


def test_example_script_submits_a_job_and_follows_it_to_the_end(api, worker, dataset, module_dir):
    spec = module_dir / "example-job.json"
    spec.write_text(json.dumps(tiny_job(dataset, steps=3)))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "submit_job.py"),
            str(spec),
            "--url",
            api.url,
            "--name",
            "from-a-script",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("step")] == ["1/3", "2/3", "3/3"]
    assert any(line.endswith(": completed") for line in lines)
    assert lines[-1].startswith("done: 3 steps")

    bad = module_dir / "bad-job.json"
    bad.write_text(json.dumps(tiny_job(dataset, micro_batch_size=0)))
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "submit_job.py"), str(bad), "--url", api.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "micro_batch_size: must be greater than 0" in out.stderr
