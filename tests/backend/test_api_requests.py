"""The API without a worker: validation answers, auth, OpenAPI derived from the job config, presets, health,
the built UI served with an SPA fallback. Real Redis, real HTTP."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import httpx
import pytest
from backend_support import ApiServer, make_settings, tiny_job


def queue_length(redis_server, settings) -> int:
    return redis_server.client().llen(settings.queue)


def loc_of(resp: httpx.Response) -> list[list]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in resp.json()["detail"]]


@pytest.mark.parametrize(
    ("change", "loc", "fragment"),
    [
        ({"model": "no-such-preset"}, ["body", "model"], "unknown preset"),
        (
            {"data": {"path": "/nonexistent/train.jsonl", "format": "tokens"}},
            ["body", "data", "path"],
            "does not exist",
        ),
        ({"optimizer": {"lr": -1.0}}, ["body", "optimizer", "lr"], "greater than 0"),
        ({"micro_batch_size": 0}, ["body", "micro_batch_size"], "greater than 0"),
        ({"bogus": 1}, ["body", "bogus"], "unknown key"),
        ({"data": {"path": "x", "formt": "tokens"}}, ["body", "data", "formt"], "did you mean 'format'"),
        ({"optimizer": {"betas": [0.9, 1.5]}}, ["body", "optimizer", "betas", 1], "[0, 1)"),
        ({"name": 5}, ["body", "name"], "must be a string"),
    ],
)
def test_bad_job_is_422_naming_the_field_and_nothing_is_enqueued(
    client, settings, redis_server, dataset, change, loc, fragment
):
    resp = client.post("/api/jobs", json=tiny_job(dataset, **change))
    assert loc in loc_of(resp)
    detail = next(e for e in resp.json()["detail"] if e["loc"] == loc)
    assert fragment in detail["msg"]
    assert client.get("/api/jobs").json()["total"] == 0
    assert queue_length(redis_server, settings) == 0


def test_every_bad_field_is_reported_at_once(client, dataset):
    resp = client.post("/api/jobs", json=tiny_job(dataset, micro_batch_size=0, optimizer={"lr": -1}, extra=1))
    locs = loc_of(resp)
    assert {"body,micro_batch_size", "body,optimizer,lr", "body,extra"} <= {
        ",".join(map(str, x)) for x in locs
    }
    types = {tuple(e["loc"]): e["type"] for e in resp.json()["detail"]}
    assert types[("body", "extra")] == "extra_forbidden"


def test_malformed_json_and_non_object_bodies_are_422(client, settings, redis_server):
    resp = client.post(
        "/api/jobs", content=b'{"model": "tiny-qwen3",', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["type"] == "json_invalid"
    resp = client.post("/api/jobs", json=[1, 2])
    assert loc_of(resp) == [["body"]]
    resp = client.post("/api/jobs", json={})
    assert ["body", "model"] in loc_of(resp) and ["body", "data"] in loc_of(resp)
    assert client.get("/api/jobs").json()["total"] == 0
    assert queue_length(redis_server, settings) == 0


def test_plan_preview_validates_like_job_creation(client, dataset):
    assert loc_of(client.post("/api/plan", json=tiny_job(dataset, optimizer={"lr": 0}))) == [
        ["body", "optimizer", "lr"]
    ]
    assert loc_of(client.post("/api/plan", json=tiny_job(dataset, model="nope"))) == [["body", "model"]]
    assert loc_of(client.post("/api/plan", json=tiny_job(dataset, host="no-such-host"))) == [["body", "host"]]
    plan = client.post("/api/plan", json=tiny_job(dataset, data={"path": "/missing.jsonl"})).json()
    assert [v["loc"] for v in plan["validation"]] == ["data.path"]
    assert plan["host"]


def test_unknown_job_is_404(client):
    for method, path in [
        ("GET", "/api/jobs/999"),
        ("POST", "/api/jobs/999/cancel"),
        ("POST", "/api/jobs/999/resume"),
        ("DELETE", "/api/jobs/999"),
        ("GET", "/api/jobs/999/metrics"),
        ("GET", "/api/jobs/999/events"),
    ]:
        resp = client.request(method, path)
        assert resp.status_code == 404, (method, path, resp.text)
        assert "999" in resp.json()["detail"]


def test_openapi_request_schema_is_the_runtime_job_config(client):
    from slidedp.config import JobConfig

    schema = client.get("/openapi.json").json()
    comps = schema["components"]["schemas"]
    body = schema["paths"]["/api/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"] == "#/components/schemas/JobCreate"

    def check(cls, component):
        props = comps[component]["properties"]
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        assert [p for p in props if p not in ("name", "host")] == names
        assert comps[component]["additionalProperties"] is False
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                check(hints[f.name], props[f.name]["$ref"].rsplit("/", 1)[1])
            else:
                assert props[f.name].get("description") == f.metadata["doc"]

    check(JobConfig, "JobCreate")
    lr = comps["JobOptimizerConfig"]["properties"]["lr"]
    assert lr["exclusiveMinimum"] == 0.0 and lr["default"] == 1e-5


def test_presets_are_valid_job_configs(client):
    from slidedp.config import JobConfig

    items = {p["label"]: p for p in client.get("/api/presets").json()["items"]}
    assert {"CPU demo", "Qwen3-8B on 2 GPUs", "Qwen3-1.7B on 1 GPU"} <= set(items)
    for preset in items.values():
        JobConfig.from_dict(preset["config"])
    assert items["CPU demo"]["config"]["model"] == "demo-qwen3"
    assert items["Qwen3-8B on 2 GPUs"]["config"]["gpus"] == 2


def test_health_reports_database_and_redis(client):
    assert client.get("/api/health").json() == {"status": "ok", "database": True, "redis": True, "workers": 0}


def test_token_is_required_when_set(module_dir, redis_server, dataset):
    settings = make_settings(module_dir / "auth-data", redis_server.url, api_token="s3cret")
    with ApiServer(settings) as api, httpx.Client(base_url=api.url) as c:
        for path in ("/api/jobs", "/api/health", "/api/hosts", "/api/presets"):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/api/jobs?access_token=s3cret").status_code == 401  # the token is a header, never in a URL
        resp = c.post("/api/jobs", json=tiny_job(dataset))
        assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
        assert redis_server.client().llen(settings.queue) == 0
        assert c.get("/openapi.json").status_code == 200  # the schema is public; the API is not


def test_built_ui_is_served_with_spa_fallback(module_dir, redis_server):
    dist = module_dir / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>SlideDP</title>")
    (dist / "assets" / "app.js").write_text("console.log(1)")
    settings = make_settings(module_dir / "ui-data", redis_server.url, frontend_dir=dist)
    with ApiServer(settings) as api, httpx.Client(base_url=api.url) as c:
        assert c.get("/").text.startswith("<!doctype html>")
        assert c.get("/jobs/12").text.startswith("<!doctype html>")  # a UI route
        assert c.get("/assets/app.js").text == "console.log(1)"
        assert c.get("/api/nope").status_code == 404
        assert c.get("/../../etc/passwd").text.startswith("<!doctype html>")


def test_api_process_never_imports_torch(module_dir, redis_server, dataset):
    """The API validates and plans jobs with slidedp's torch-free modules only."""
    code = f"""
import sys
from fastapi.testclient import TestClient
from slidedp_web.core.config import Settings
from slidedp_web.main import create_app
s = Settings(_env_file=None, data_dir={str(module_dir / "notorch")!r}, redis_url={redis_server.url!r})
job = {tiny_job(dataset)!r}
with TestClient(create_app(s)) as c:
    assert c.post("/api/plan", json=job).status_code == 200
    assert c.post("/api/jobs", json=dict(job, micro_batch_size=0)).status_code == 422
    created = c.post("/api/jobs", json=job)
    assert created.status_code == 201, created.text
    assert c.get("/api/jobs").json()["total"] == 1
    assert c.get("/api/presets").status_code == 200
print("torch" in sys.modules, "transformers" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "False"]


def _write_logs(env: dict, job_id: int, writer: int, lines: int) -> None:
    import os

    os.environ.update(env)
    from slidedp_web.core.config import Settings
    from slidedp_web.journal import record_log

    settings = Settings(_env_file=None)
    for i in range(lines):
        record_log(settings, job_id, f"writer {writer} line {i}")


def test_processes_writing_one_sqlite_journal_get_gap_free_event_ids(client, settings, dataset):
    """API, worker and job process all write a job's events: each id is taken once, none is skipped."""
    import multiprocessing as mp

    from backend_support import read_sse

    job = client.post("/api/jobs", json=tiny_job(dataset)).json()
    assert client.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_logs, args=(settings.env(), job["id"], w, 30)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    events = read_sse(client, f"/api/jobs/{job['id']}/events")
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    seqs = sorted(e["data"]["seq"] for e in events if e["event"] == "log")
    assert seqs == list(range(1, 91))
    assert client.delete(f"/api/jobs/{job['id']}").status_code == 204


def test_a_body_that_is_not_utf8_text_is_a_400_that_says_so(client):
    for path in ("/api/jobs", "/api/plan"):
        resp = client.post(path, content=b'{"model": "\xff"}', headers={"content-type": "application/json"})
        assert resp.status_code == 400 and "UTF-8" in resp.json()["detail"], resp.text
    assert "400" in client.get("/openapi.json").json()["paths"]["/api/jobs"]["post"]["responses"]


# A job's policy column, as rows hold it. The plan made at submit time (planning.summary of plan_job's JSON, as
# the planner wrote it before reduce_dtype was retired), for a two-layer model on one CPU rank.
PLANNED_POLICY = {
    "delivery": "replicated",
    "grad_reduce": "host",
    "reduce_dtype": "fp32",
    "edge_update": "host",
    "device_layers": 0,
    "activations": ["checkpoint", "checkpoint"],
    "resident": [False, False],
    "window": 3,
    "chunk_mb": 64,
    "loss_chunk_tokens": 4096,
}
SUBMITTED = {
    "feasible": True,
    "policy": PLANNED_POLICY,
    "predicted": {
        "step_time_s": None,
        "tokens_per_s": None,
        "phases": {},
        "exposed": {},
        "host_ram_gib": 0.01,
    },
    "candidates": [
        {"policy": PLANNED_POLICY, "predicted": {"step_time_s": None}, "fits": True, "why_not": None}
    ],
    "marginal": None,
    "why": "Routes (one rank): replicated delivery, host gradient reduction.",
    "errors": [],
    "job": {"world": 1, "layers": 2, "host_limit_gib": 8.0},
    "calibration": "missing",
    "calibration_note": "no calibration given: memory fit only, no step times",
    "host": "node-a",
    "stage": "planned",
}
# What the run's engine resolved (slidedp.launch.resolve_policy's dict) and the plan it made itself.
RAN = {
    "delivery": "replicated",
    "grad_reduce": "host",
    "reduce_dtype": "fp32",
    "delivery_cast": "host",
    "edge_update": "host",
    "device_layers": 0,
    "activations": ["keep", "checkpoint"],
    "resident": [True, False],
    "window": 2,
    "chunk_mb": 64,
    "loss_chunk_tokens": 2048,
    "staging_slots": 8,
}
RAN_POLICY = {k: v for k, v in RAN.items() if k != "reduce_dtype"}
RUNTIME_PLAN = {
    **{k: v for k, v in SUBMITTED.items() if k not in ("host", "stage")},
    "why": "planned at start",
}


def test_a_job_policy_of_today_is_answered_as_plan_and_resolved_policy():
    from slidedp_web.planning import job_policy

    # outcome.finish stores {**job.policy, **outcome["policy"]}, outcome["policy"] = {**resolved, "plan": plan}.
    row = {**SUBMITTED, **RAN, "plan": RUNTIME_PLAN}
    answer = job_policy(row)
    assert answer["stage"] == "resolved"
    assert answer["policy"] == RAN_POLICY
    assert list(answer["policy"]) == list(RAN_POLICY)  # the documented key order
    # Everything else is the plan made at submit time, without the run's keys at the top.
    rest = {k: v for k, v in answer.items() if k not in ("stage", "policy", "candidates")}
    assert rest == {k: v for k, v in SUBMITTED.items() if k not in ("stage", "policy", "candidates")}
    assert "reduce_dtype" not in answer["candidates"][0]["policy"]
    assert "plan" not in answer and "reduce_dtype" not in answer
    assert row == {**SUBMITTED, **RAN, "plan": RUNTIME_PLAN}  # the row itself is left as it is

    # A run that predates delivery_cast, edge_update and device_layers ran with what there was then.
    early = {k: v for k, v in RAN.items() if k not in ("delivery_cast", "edge_update", "device_layers")}
    answer = job_policy({**SUBMITTED, **early, "keep_layers": 1, "resident_units": 1, "plan": {}})
    assert answer["policy"] == RAN_POLICY
    # No plan was kept at submit time (the preview failed): the plan the run made is the one shown.
    answer = job_policy({**RAN, "plan": RUNTIME_PLAN})
    assert answer["why"] == "planned at start" and answer["policy"] == RAN_POLICY
    assert answer["stage"] == "resolved"


def test_a_job_policy_of_the_documented_shape_passes_through():
    from slidedp_web.planning import job_policy

    planned = {**SUBMITTED, "policy": RAN_POLICY, "candidates": [{"policy": RAN_POLICY, "fits": True}]}
    assert job_policy(planned) == planned
    resolved = {**planned, "stage": "resolved"}
    assert job_policy(resolved) == resolved
    refused = {
        "feasible": False,
        "policy": None,
        "predicted": None,
        "candidates": [],
        "errors": [],
        "stage": "planned",
    }
    assert job_policy(refused) == refused
    assert job_policy(None) is None
    # A plan the planner wrote with reduce_dtype reads without it.
    assert job_policy(SUBMITTED)["policy"] == {k: v for k, v in PLANNED_POLICY.items() if k != "reduce_dtype"}
