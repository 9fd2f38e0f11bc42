"""The same backend on PostgreSQL (the local server, trust auth): migrations, REST, gap-free event sequences
under concurrent writers, and a real job run. Each test module works in a schema of its own, dropped after."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
import sqlalchemy as sa
from backend_support import ApiServer, WorkerProcess, make_settings, post_at_once, read_sse, tiny_job

PG = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="module")
def pg_schema():
    admin = sa.create_engine(PG.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG} is not reachable ({exc}); start it or run the SQLite suites only")
    schema = f"slidedp_test_{uuid.uuid4().hex[:10]}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    yield schema
    from slidedp_web.core import db

    for url, engine in list(db._engines.items()):
        if schema in url:
            engine.dispose()
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(scope="module")
def settings(module_dir, redis_server, pg_schema):
    return make_settings(
        module_dir / "data", redis_server.url, database_url=f"{PG}?options=-csearch_path%3D{pg_schema}"
    )


def test_migrations_create_the_tables_in_the_schema(api, settings, pg_schema):
    from slidedp_web.core.db import get_engine

    with get_engine(settings).connect() as conn:
        assert conn.execute(sa.text("SELECT current_schema()")).scalar() == pg_schema
        tables = set(sa.inspect(conn).get_table_names(schema=pg_schema))
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    assert {
        "jobs",
        "job_status_history",
        "job_metrics",
        "job_logs",
        "job_events",
        "hosts",
        "generations",
        "alembic_version",
    } <= tables
    assert version == "0005"
    with get_engine(settings).connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("jobs", schema=pg_schema)}
    assert {"owner_token", "outputs", "init_from_job", "action"} <= columns


def test_two_requests_for_one_folder_at_once_create_one_job_on_postgres(client, dataset, tmp_path):
    """The folder check and the insert share a transaction under an advisory lock: Postgres's READ COMMITTED alone
    would let both requests see no owner."""
    folder = str(tmp_path / "pg-race")
    answers = post_at_once(str(client.base_url), "/api/jobs", {**tiny_job(dataset), "output_dir": folder}, 6)
    assert sorted(answers) == [201] + [409] * 5, answers
    jobs = client.get("/api/jobs").json()["items"]
    assert [j["output_dir"] for j in jobs].count(folder) == 1
    for job in jobs:
        client.post(f"/api/jobs/{job['id']}/cancel")
        client.delete(f"/api/jobs/{job['id']}")


def test_jobs_over_rest_on_postgres(client, dataset):
    created = client.post("/api/jobs", json={**tiny_job(dataset), "name": "pg"})
    assert created.status_code == 201, created.text
    job = created.json()
    assert client.get(f"/api/jobs/{job['id']}").json()["name"] == "pg"
    assert client.get("/api/jobs?status=queued").json()["total"] == 1
    assert client.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    assert client.delete(f"/api/jobs/{job['id']}").status_code == 204
    assert client.get("/api/jobs").json() == {"items": [], "total": 0}


def test_concurrent_writers_get_gap_free_event_ids(client, settings, dataset):
    from slidedp_web.journal import record_log

    job = client.post("/api/jobs", json=tiny_job(dataset)).json()
    client.post(f"/api/jobs/{job['id']}/cancel")
    writers, lines = 4, 25

    def write(w: int) -> None:
        for i in range(lines):
            record_log(settings, job["id"], f"writer {w} line {i}")

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    events = read_sse(client, f"/api/jobs/{job['id']}/events")
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    logs = [e["data"] for e in events if e["event"] == "log"]
    assert sorted(entry["seq"] for entry in logs) == list(range(1, writers * lines + 1))
    assert len({entry["line"] for entry in logs}) == writers * lines


@pytest.mark.slow
def test_a_job_runs_to_completion_on_postgres(client, settings, module_dir, dataset):
    worker = WorkerProcess(settings, module_dir / "worker.log").start()
    try:
        job = client.post("/api/jobs", json=tiny_job(dataset, steps=3)).json()
        events = read_sse(client, f"/api/jobs/{job['id']}/events", timeout=180)
        assert [e["data"]["status"] for e in events if e["event"] == "status"] == [
            "queued",
            "running",
            "completed",
        ]
        assert [m["step"] for m in client.get(f"/api/jobs/{job['id']}/metrics").json()["items"]] == [1, 2, 3]
    finally:
        worker.stop()


def test_api_answers_from_postgres_after_restart(settings):
    with ApiServer(settings) as api, httpx.Client(base_url=api.url) as c:
        assert c.get("/api/health").json()["database"] is True
        assert c.get("/api/jobs").status_code == 200
