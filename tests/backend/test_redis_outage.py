"""Redis down: creating, cancelling, resuming and following jobs answer 503 with a clear message, reads from
the database keep working, and the queued jobs Redis lost are sent again when it is back."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from backend_support import ApiServer, RedisServer, make_settings, tiny_job, wait_for


@pytest.fixture(scope="module")
def own_redis(module_dir):
    server = RedisServer(module_dir)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def settings(module_dir, own_redis):
    return make_settings(module_dir / "data", own_redis.url)


def queued_messages(redis_server, queue: str) -> list[tuple[str, list]]:
    out = []
    for raw in redis_server.client().lrange(queue, 0, -1):
        msg = json.loads(raw)
        body = json.loads(base64.b64decode(msg["body"]))
        out.append((msg["headers"]["task"], body[0]))
    return out


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_redis_outage_refuses_writes_keeps_reads_and_requeues_lost_jobs(client, settings, own_redis, dataset):
    job = client.post("/api/jobs", json=tiny_job(dataset)).json()
    assert queued_messages(own_redis, settings.queue) == [("slidedp.run_job", [job["id"], 1])]

    own_redis.stop()
    resp = client.post("/api/jobs", json=tiny_job(dataset))
    assert resp.status_code == 503
    assert "Redis" in resp.json()["detail"] and "can still be read" in resp.json()["detail"]
    for path in (f"/api/jobs/{job['id']}/cancel", f"/api/jobs/{job['id']}/resume"):
        assert client.post(path).status_code == 503
    assert client.get(f"/api/jobs/{job['id']}/events").status_code == 503

    listed = client.get("/api/jobs").json()
    assert listed["total"] == 1 and listed["items"][0]["status"] == "queued"
    assert client.get(f"/api/jobs/{job['id']}").json()["status"] == "queued"
    assert client.get(f"/api/jobs/{job['id']}/metrics").status_code == 200
    assert client.get(f"/api/jobs/{job['id']}/logs").status_code == 200
    assert client.get("/api/health").json() == {
        "status": "degraded",
        "database": True,
        "redis": False,
        "workers": 0,
    }

    own_redis.start()  # back, and empty: the queue message is gone
    wait_for(lambda: queued_messages(own_redis, settings.queue), 20, "the queued job to be sent again")
    assert queued_messages(own_redis, settings.queue) == [("slidedp.run_job", [job["id"], 1])]
    assert client.get("/api/health").json()["status"] == "ok"
    assert client.post("/api/jobs", json=tiny_job(dataset)).status_code == 201


def test_a_second_api_process_finding_redis_intact_sends_nothing_again(settings, own_redis, dataset):
    """The marker says this Redis still holds the queue: no duplicate messages on an API restart."""
    before = queued_messages(own_redis, settings.queue)
    with ApiServer(settings) as api, httpx.Client(base_url=api.url) as c:
        assert c.get("/api/health").json()["redis"] is True
        time.sleep(3 * settings.watchdog_s + 1)
    assert queued_messages(own_redis, settings.queue) == before


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_worker_told_to_stop_while_redis_is_gone_still_exits(module_dir):
    """Stopping `slidedp serve` (or a killed one) takes Redis and the worker down together; Celery's own shutdown
    would keep retrying the vanished broker, so the worker bounds its shutdown."""
    import signal

    from backend_support import WorkerProcess
    from slidedp_web.worker import IDLE_EXIT_S

    broker = RedisServer(module_dir)
    broker.start()
    worker = WorkerProcess(
        make_settings(module_dir / "data-exit", broker.url), module_dir / "exit-worker.log"
    )
    worker.start()
    try:
        broker.stop()
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(IDLE_EXIT_S + 30)
        assert time.monotonic() - started < IDLE_EXIT_S + 30
    finally:
        worker.stop(timeout=5)
        broker.stop()
