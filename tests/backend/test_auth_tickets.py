"""Tickets (POST /api/tickets) against the real API over HTTP: a ticket opens one GET of one path once, within its
lifetime; the token itself is never accepted in a URL; only a job's event stream and export get tickets."""

from __future__ import annotations

import time
from datetime import datetime

import httpx
import pytest
from backend_support import ApiServer, make_settings, tiny_job

TOKEN = "tickets-s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def api(module_dir, redis_server):
    settings = make_settings(module_dir / "data", redis_server.url, api_token=TOKEN)
    with ApiServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api):
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def jobs(client, dataset) -> tuple[int, int]:
    """Two queued jobs (no worker runs them): their event streams stay open, their exports are 404s."""
    ids = []
    for name in ("one", "two"):
        resp = client.post("/api/jobs", json={**tiny_job(dataset), "name": name}, headers=AUTH)
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    return ids[0], ids[1]


def ticket_for(client: httpx.Client, path: str) -> str:
    resp = client.post("/api/tickets", json={"path": path}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()["ticket"]


def open_status(client: httpx.Client, url: str, headers: dict | None = None) -> int:
    """The status of a GET, without reading a (possibly endless) event stream's body."""
    with client.stream("GET", url, headers=headers or {}) as resp:
        return resp.status_code


def test_a_ticket_opens_its_event_stream_once(client, jobs):
    job = jobs[0]
    path = f"/api/jobs/{job}/events"
    before = time.time()
    resp = client.post("/api/tickets", json={"path": path}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert set(body) == {"ticket", "path", "expires_at", "expires_in_s"}
    assert body["path"] == path and body["expires_in_s"] == 60
    expires_at = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00")).timestamp()
    assert before + 55 <= expires_at <= time.time() + 65
    ticket = body["ticket"]
    assert TOKEN not in ticket

    assert open_status(client, f"{path}?ticket={ticket}") == 200
    assert open_status(client, f"{path}?ticket={ticket}") == 401  # spent
    # Other query parameters ride along; the ticket is for the path.
    again = ticket_for(client, path)
    assert open_status(client, f"{path}?last_event_id=0&ticket={again}") == 200


def test_a_ticket_opens_only_its_own_path(client, jobs):
    one, two = jobs
    ticket = ticket_for(client, f"/api/jobs/{one}/events")
    for other in (
        f"/api/jobs/{two}/events",
        f"/api/jobs/{one}/export",
        f"/api/jobs/{one}",
        f"/api/jobs/{one}/logs",
        "/api/jobs",
        "/metrics",
    ):
        resp = client.get(f"{other}?ticket={ticket}")
        assert resp.status_code == 401, (other, resp.status_code, resp.text)
    # Tried on the wrong paths, it still opens its own, once.
    assert open_status(client, f"/api/jobs/{one}/events?ticket={ticket}") == 200
    assert open_status(client, f"/api/jobs/{one}/events?ticket={ticket}") == 401


def test_an_export_ticket_passes_auth_once(client, jobs):
    one, _ = jobs
    ticket = ticket_for(client, f"/api/jobs/{one}/export")
    first = client.get(f"/api/jobs/{one}/export?ticket={ticket}")
    # Past auth: the queued job has no export.
    assert first.status_code == 404 and "no export yet" in first.json()["detail"]
    assert client.get(f"/api/jobs/{one}/export?ticket={ticket}").status_code == 401


def test_forged_and_malformed_tickets_are_refused(client, jobs):
    one, _ = jobs
    path = f"/api/jobs/{one}/events"
    real = ticket_for(client, path)
    key, _, secret = real.partition(".")
    for forged in (
        f"{key}.{'A' * len(secret)}",
        key,
        "",
        ".",
        "x.y",
        real + "x",
        TOKEN,
        "ünï.cödé",
        "\x00.\x00",
        f"{key}.{secret}\x00",
    ):
        assert client.get(path, params={"ticket": forged}).status_code == 401, forged
    assert open_status(client, f"{path}?ticket={real}") == 200


def test_the_token_in_a_url_is_refused(client, jobs):
    one, _ = jobs
    assert client.get(f"/api/jobs?access_token={TOKEN}").status_code == 401
    assert client.get(f"/api/jobs/{one}/events?access_token={TOKEN}").status_code == 401
    assert client.get(f"/api/jobs/{one}/export?access_token={TOKEN}").status_code == 401
    assert client.get(f"/api/jobs?token={TOKEN}").status_code == 401
    assert client.get("/api/jobs", headers=AUTH).status_code == 200


def test_tickets_need_the_bearer_header(client, jobs):
    one, _ = jobs
    body = {"path": f"/api/jobs/{one}/events"}
    assert client.post("/api/tickets", json=body).status_code == 401
    assert (
        client.post("/api/tickets", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    )
    # Neither the token nor a ticket in the URL buys a ticket.
    assert client.post(f"/api/tickets?access_token={TOKEN}", json=body).status_code == 401
    ticket = ticket_for(client, f"/api/jobs/{one}/events")
    assert client.post(f"/api/tickets?ticket={ticket}", json=body).status_code == 401
    # A ticket opens a GET only, not a write on its path's neighbours.
    ticket = ticket_for(client, f"/api/jobs/{one}/events")
    assert client.post(f"/api/jobs/{one}/cancel?ticket={ticket}").status_code == 401
    assert client.delete(f"/api/jobs/{one}?ticket={ticket}").status_code == 401


@pytest.mark.parametrize(
    "path",
    [
        "/api/jobs",
        "/api/jobs/1",
        "/api/jobs/1/logs",
        "/api/jobs/1/metrics",
        "/api/jobs/1/events/",
        "/api/jobs/1/events?last_event_id=3",
        "/api/jobs/01/events",
        "/api/jobs/-1/events",
        "/api/jobs/99999999999999999999/events",
        "/api/jobs/1/../2/events",
        "/api/health",
        "/api/tickets",
        "/metrics",
        "http://127.0.0.1/api/jobs/1/events",
        "",
    ],
)
def test_only_event_streams_and_exports_get_tickets(client, path):
    resp = client.post("/api/tickets", json={"path": path}, headers=AUTH)
    assert resp.status_code == 422, (path, resp.text)
    assert resp.json()["detail"][0]["loc"] == ["body", "path"]


def test_ticket_request_shape(client):
    assert client.post("/api/tickets", json={}, headers=AUTH).status_code == 422
    resp = client.post("/api/tickets", json={"path": "/api/jobs/1/export", "ttl": 999}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "ttl"]
    assert client.post("/api/tickets", json={"path": "/api/jobs/9223372036854775807/export"},
                       headers=AUTH).status_code == 201  # fmt: skip


def test_tickets_expire_and_are_bounded(module_dir, redis_server, dataset):
    settings = make_settings(
        module_dir / "short", redis_server.url, api_token=TOKEN, ticket_ttl_s=1.0, max_tickets=3
    )
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as c:
        job = c.post("/api/jobs", json=tiny_job(dataset), headers=AUTH).json()["id"]
        path = f"/api/jobs/{job}/events"
        tickets = [ticket_for(c, path) for _ in range(3)]
        resp = c.post("/api/tickets", json={"path": path}, headers=AUTH)
        assert resp.status_code == 429 and "SLIDEDP_MAX_TICKETS" in resp.json()["detail"]
        assert resp.headers["retry-after"] == "1"
        assert open_status(c, f"{path}?ticket={tickets[0]}") == 200  # a spent ticket frees its place
        fresh = ticket_for(c, path)
        time.sleep(1.5)
        assert open_status(c, f"{path}?ticket={tickets[1]}") == 401  # expired
        assert open_status(c, f"{path}?ticket={fresh}") == 401
        # Expired tickets no longer count against the bound.
        for _ in range(3):
            ticket_for(c, path)


def test_without_a_token_tickets_are_not_needed_but_still_issued(module_dir, redis_server, dataset):
    settings = make_settings(module_dir / "open", redis_server.url)
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as c:
        job = c.post("/api/jobs", json=tiny_job(dataset)).json()["id"]
        assert open_status(c, f"/api/jobs/{job}/events") == 200
        resp = c.post("/api/tickets", json={"path": f"/api/jobs/{job}/events"})
        assert resp.status_code == 201
        assert open_status(c, f"/api/jobs/{job}/events?ticket={resp.json()['ticket']}") == 200
        assert c.get("/api/jobs?ticket=anything").status_code == 200  # ignored without a token


def test_openapi_documents_tickets(client):
    schema = client.get("/openapi.json").json()
    post = schema["paths"]["/api/tickets"]["post"]
    assert {"201", "401", "422"} <= set(post["responses"])
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "HTTPValidationError"
    )
    body = schema["components"]["schemas"]["TicketRequest"]
    assert body["required"] == ["path"]
    out = schema["components"]["schemas"]["Ticket"]
    assert set(out["properties"]) == {"ticket", "path", "expires_at", "expires_in_s"}
    for path in ("/api/jobs/{job_id}/events", "/api/jobs/{job_id}/export"):
        get = schema["paths"][path]["get"]
        (ticket,) = [p for p in get["parameters"] if p["name"] == "ticket"]
        assert ticket["in"] == "query" and not ticket["required"]
        assert "401" in get["responses"]
    # Routes that take only the header do not advertise a ticket.
    for path, ops in schema["paths"].items():
        if path not in ("/api/jobs/{job_id}/events", "/api/jobs/{job_id}/export"):
            for op in ops.values():
                assert all(p["name"] != "ticket" for p in op.get("parameters", [])), path
