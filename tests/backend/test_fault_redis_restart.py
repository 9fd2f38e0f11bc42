"""Redis restarted (empty) while a job trains and another waits: writes and new event streams answer 503 with a
clear message, reads keep working and the running job keeps training into the database, a stream opened before
the outage carries on from the database, the lost queue message is sent again, and after Redis is back the live
stream, cancel and the queue work as before. Nothing is lost: every step, every event id, both jobs' ends.
(tests/backend/test_redis_outage.py covers an outage with no worker at all.)"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from backend_support import (
    RedisServer,
    WorkerProcess,
    make_settings,
    read_sse,
    tiny_job,
    wait_for,
    wait_status,
)
from fault_support import metric_steps, scrape, statuses
from test_redis_outage import queued_messages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # ran 60 s on an idle 2-core machine, 75 s on a loaded one; a hang still fails


@pytest.fixture(scope="module")
def own_redis(module_dir):
    server = RedisServer(module_dir)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def settings(module_dir, own_redis):
    return make_settings(module_dir / "data", own_redis.url)


def unavailable(resp: httpx.Response) -> str:
    assert resp.status_code == 503, (resp.status_code, resp.text)
    detail = resp.json()["detail"]
    assert "Redis at" in detail and "not reachable" in detail and "can still be read" in detail
    return detail


def test_redis_restart_during_a_job_loses_nothing(client, api, settings, own_redis, module_dir, dataset):
    worker = WorkerProcess(settings, module_dir / "worker.log").start()
    try:
        running = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
        url = f"/api/jobs/{running['id']}/events"
        first = read_sse(client, url, stop=lambda ev: bool(metric_steps(ev)))
        waiting = client.post("/api/jobs", json=tiny_job(dataset, steps=3)).json()
        assert queued_messages(own_redis, settings.queue) == [("slidedp.run_job", [waiting["id"], 1])]

        # A follower that was connected before the outage reads to the end of the job.
        followed: list[dict] = []
        with httpx.Client(base_url=api.url, timeout=30) as other:
            follower = threading.Thread(
                target=lambda: followed.extend(
                    read_sse(other, url, headers={"Last-Event-ID": str(first[-1]["id"])}, timeout=150)
                ),
                daemon=True,
            )
            follower.start()
            time.sleep(1)

            own_redis.stop()
            assert "job creation" in unavailable(client.post("/api/jobs", json=tiny_job(dataset)))
            assert "cancel" in unavailable(client.post(f"/api/jobs/{running['id']}/cancel"))
            assert "resume" in unavailable(client.post(f"/api/jobs/{running['id']}/resume"))
            assert "live event stream" in unavailable(client.get(url))

            # Reads answer from the database, and the job goes on training into it.
            step = client.get(f"/api/jobs/{running['id']}").json()["step"]
            wait_for(
                lambda: client.get(f"/api/jobs/{running['id']}").json()["step"] >= step + 3,
                30,
                "the job to keep training while Redis is down",
            )
            listed = {j["id"]: j["status"] for j in client.get("/api/jobs").json()["items"]}
            assert listed == {running["id"]: "running", waiting["id"]: "queued"}
            assert client.get(f"/api/jobs/{running['id']}/metrics").status_code == 200
            assert client.get(f"/api/jobs/{running['id']}/logs").status_code == 200
            health = client.get("/api/health").json()
            assert (health["status"], health["database"], health["redis"]) == ("degraded", True, False)
            seen = scrape(client)
            assert seen[("slidedp_redis_up", ())] == 0 and seen[("slidedp_database_up", ())] == 1
            assert not [k for k in seen if k[0] == "slidedp_queue_length"]  # unknown, not zero
            assert seen[("slidedp_jobs", (("status", "running"),))] == 1
            assert seen[("slidedp_jobs", (("status", "queued"),))] == 1

            own_redis.start()  # back, and empty: the waiting job's message went with it
            wait_for(
                lambda: (
                    queued_messages(own_redis, settings.queue) == [("slidedp.run_job", [waiting["id"], 1])]
                ),
                30,
                "the waiting job to be sent again",
            )
            assert scrape(client)[("slidedp_queue_length", (("queue", settings.queue),))] == 1

            # The live stream is back: a new connection resumes after the last id it saw.
            live = read_sse(client, url, stop=lambda ev: len(metric_steps(ev)) >= 2)
            assert [e["id"] for e in live] == list(range(1, len(live) + 1))
            assert client.post(f"/api/jobs/{running['id']}/cancel").status_code == 200
            follower.join(60)
            assert not follower.is_alive(), "the stream opened before the outage did not end with the job"

        done = wait_status(client, running["id"], ("cancelled",), timeout=30)
        events = first + followed
        assert [e["id"] for e in events] == list(range(1, len(events) + 1))  # no gap, no repeat
        assert statuses(events) == ["queued", "running", "cancelled"]
        assert metric_steps(events) == list(range(1, done["step"] + 1))
        stored = client.get(f"/api/jobs/{running['id']}/metrics").json()["items"]
        assert [m["step"] for m in stored] == metric_steps(events)

        # The re-sent message runs the waiting job, once.
        finished = wait_status(client, waiting["id"], ("completed", "failed"), timeout=120)
        assert (finished["status"], finished["step"]) == ("completed", 3)
        assert statuses(read_sse(client, f"/api/jobs/{waiting['id']}/events")) == [
            "queued",
            "running",
            "completed",
        ]
    finally:
        worker.stop()
