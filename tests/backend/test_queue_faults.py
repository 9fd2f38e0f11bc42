"""The queue under faults: a job longer than the broker's visibility timeout runs once; a worker killed
mid-job leaves the job interrupted (heartbeat), a worker shut down mid-job leaves it interrupted with a
checkpoint; both resume to completion on a new worker."""

from __future__ import annotations

import os
import signal
import time

import pytest
from backend_support import WorkerProcess, make_settings, read_sse, tiny_job, wait_for, wait_status

pytestmark = pytest.mark.slow
VISIBILITY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(
        module_dir / "data", redis_server.url, broker_visibility_timeout_s=VISIBILITY_TIMEOUT_S
    )


def statuses(events):
    return [e["data"]["status"] for e in events if e["event"] == "status"]


def test_job_longer_than_the_visibility_timeout_runs_exactly_once(
    client, settings, module_dir, dataset, redis_server
):
    # A second worker on another queue of the same Redis scans for expired unacknowledged messages every
    # second: were the running job's message still unacknowledged, it would put it back on its queue.
    other = WorkerProcess(
        make_settings(
            module_dir / "data", redis_server.url, broker_visibility_timeout_s=VISIBILITY_TIMEOUT_S
        ),
        module_dir / "other-worker.log",
        name="other-host",
    ).start()
    main = WorkerProcess(settings, module_dir / "worker-vt.log").start()
    try:
        job = client.post(
            "/api/jobs", json={**tiny_job(dataset, steps=250), "host": settings.host_name}
        ).json()
        wait_status(client, job["id"], ("running",))
        started = time.monotonic()
        r = redis_server.client()
        while client.get(f"/api/jobs/{job['id']}").json()["status"] == "running":
            assert r.hlen("unacked") == 0, "a running job left an unacknowledged message behind"
            time.sleep(0.5)
        assert time.monotonic() - started > 3 * VISIBILITY_TIMEOUT_S
        time.sleep(3 * VISIBILITY_TIMEOUT_S)  # time for any redelivery to show
        events = read_sse(client, f"/api/jobs/{job['id']}/events")
        assert statuses(events) == ["queued", "running", "completed"]
        steps = [e["data"]["step"] for e in events if e["event"] == "metrics"]
        assert steps == list(range(1, 251))
        assert r.llen(settings.queue) == 0 and r.hlen("unacked") == 0
        assert main.log().count("] received") == 1
        assert "duplicate or stale delivery ignored" not in main.log()
    finally:
        main.stop()
        other.stop()


def test_killed_worker_leaves_the_job_interrupted_and_it_resumes(client, settings, module_dir, dataset):
    worker = WorkerProcess(settings, module_dir / "worker-kill.log").start()
    job = client.post(
        "/api/jobs",
        json={**tiny_job(dataset, steps=400, checkpoint={"interval": 20}), "host": settings.host_name},
    ).json()
    read_sse(
        client,
        f"/api/jobs/{job['id']}/events",
        stop=lambda ev: any(e["event"] == "metrics" and e["data"]["step"] >= 25 for e in ev),
    )
    os.kill(worker.proc.pid, signal.SIGKILL)  # the worker dies; nothing reports for the job any more
    interrupted = wait_status(client, job["id"], ("interrupted",), timeout=settings.heartbeat_timeout_s + 30)
    # said by the orphaned job process itself when it stops at a step boundary, or by the sweep once no heartbeat
    # comes any more
    message = interrupted["error"]["message"]
    assert "died during the job" in message or "stopped reporting" in message, message
    assert interrupted["checkpoints"], "the interval checkpoints survive the worker"
    worker.stop()
    # The orphaned job process noticed and stopped too: nothing changes any more.
    time.sleep(2)
    frozen = client.get(f"/api/jobs/{job['id']}").json()
    time.sleep(2)
    assert client.get(f"/api/jobs/{job['id']}").json()["step"] == frozen["step"]

    newest = int(frozen["checkpoints"][-1].split("-")[-1])
    replacement = WorkerProcess(settings, module_dir / "worker-kill-2.log").start()
    try:
        assert client.post(f"/api/jobs/{job['id']}/resume").json()["status"] == "queued"
        done = wait_status(client, job["id"], ("completed", "failed"), timeout=240)
        assert done["status"] == "completed", done
        assert done["step"] == 400
        runs = [
            line["line"]
            for line in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]
            if "resuming from the newest checkpoint" in line["line"]
        ]
        assert len(runs) == 1
        first_resumed = client.get(f"/api/jobs/{job['id']}/metrics?after_step=0").json()["items"]
        assert [m["step"] for m in first_resumed] == list(range(1, 401))
        assert newest >= 20
    finally:
        replacement.stop()


def test_worker_shutdown_saves_a_checkpoint_and_the_job_resumes(client, settings, module_dir, dataset):
    worker = WorkerProcess(settings, module_dir / "worker-term.log").start()
    job = client.post("/api/jobs", json={**tiny_job(dataset, steps=400), "host": settings.host_name}).json()
    read_sse(
        client, f"/api/jobs/{job['id']}/events", stop=lambda ev: any(e["event"] == "metrics" for e in ev)
    )
    worker.stop(signal.SIGTERM, timeout=60)
    assert worker.proc.returncode == 0, worker.log()[-3000:]
    stopped = client.get(f"/api/jobs/{job['id']}").json()
    assert stopped["status"] == "interrupted" and "shut down" in stopped["error"]["message"]
    assert stopped["checkpoints"] == [f"step-{stopped['step']:08d}"]

    again = WorkerProcess(settings, module_dir / "worker-term-2.log").start()
    try:
        client.post(f"/api/jobs/{job['id']}/resume")
        after = wait_status(client, job["id"], ("completed", "failed"), timeout=240)
        assert (after["status"], after["step"]) == ("completed", 400)
        wait_for(lambda: "resuming from the newest checkpoint" in again.log(), 5, "the resume log line")
    finally:
        again.stop()
