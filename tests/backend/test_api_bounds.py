"""Every field is bounded at the API: values that used to be a 500 (a database overflow, a float overflow, text a
database cannot hold) or that were accepted and then failed at run time are a 422 naming the key, and nothing is
created for them. Against the real API with a real Redis (no worker: nothing here may reach one)."""

from __future__ import annotations

import os

import pytest
from backend_support import tiny_job

BAD_VALUES = [
    ({"steps": 10**30}, ["body", "steps"]),
    ({"steps": 2**63}, ["body", "steps"]),
    ({"steps": 10**9 + 1}, ["body", "steps"]),
    ({"host_ram_gib": 1.7e299}, ["body", "host_ram_gib"]),
    ({"cpu_threads": 10**6}, ["body", "cpu_threads"]),
    ({"seed": 2**63}, ["body", "seed"]),
    ({"ranks": 1000}, ["body", "ranks"]),
    ({"micro_batch_size": 2**70}, ["body", "micro_batch_size"]),
]


def detail_locs(resp) -> list[list]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in resp.json()["detail"]]


@pytest.mark.parametrize(
    "override,loc", BAD_VALUES, ids=[str(v[1][-1]) + "=" + str(v[0]) for v in BAD_VALUES]
)
def test_out_of_range_numbers_are_a_422_naming_the_key(client, dataset, override, loc):
    for path in ("/api/jobs", "/api/plan"):
        assert loc in detail_locs(client.post(path, json={**tiny_job(dataset), **override})), path
    assert client.get("/api/jobs").json()["total"] == 0


def test_a_data_seed_past_int64_is_a_422(client, dataset):
    body = tiny_job(dataset)
    body["data"] = {**body["data"], "seed": 2**70}
    assert ["body", "data", "seed"] in detail_locs(client.post("/api/jobs", json=body))


def test_threads_and_cpu_ranks_are_bounded_by_the_host_s_cores(client, dataset):
    cores = os.cpu_count() or 1
    assert client.post("/api/plan", json={**tiny_job(dataset), "cpu_threads": cores}).status_code == 200
    resp = client.post("/api/plan", json={**tiny_job(dataset), "cpu_threads": cores + 1})
    assert ["body", "cpu_threads"] in detail_locs(resp) and f"at most {cores}" in resp.text
    assert client.post("/api/plan", json={**tiny_job(dataset), "ranks": 4 * cores}).status_code == 200
    assert ["body", "ranks"] in detail_locs(
        client.post("/api/plan", json={**tiny_job(dataset), "ranks": 4 * cores + 1})
    )


def test_host_ram_gib_can_lower_the_host_limit_but_never_raise_it(client, dataset):
    from slidedp.host_memory import host_ram_limit

    limit_gib = host_ram_limit()[0] / 2**30
    assert (
        client.post("/api/plan", json={**tiny_job(dataset), "host_ram_gib": limit_gib / 2}).status_code == 200
    )
    for path in ("/api/plan", "/api/jobs"):
        resp = client.post(path, json={**tiny_job(dataset), "host_ram_gib": 1000 + limit_gib})
        assert ["body", "host_ram_gib"] in detail_locs(resp) and "may only lower" in resp.text
    # Lowered below what the job needs, the job is refused for the figure the user gave.
    resp = client.post("/api/jobs", json={**tiny_job(dataset, model="qwen3-1.7b"), "host_ram_gib": 1})
    assert resp.status_code == 422


@pytest.mark.parametrize("where", ["name", "model", "data.path", "output_dir", "data.text_field", "key"])
@pytest.mark.parametrize("bad", ["\\u0000", "\\ud800"])
def test_text_a_database_cannot_hold_is_a_422_that_does_not_echo_it(client, dataset, where, bad):
    """Sent as raw JSON: a lone surrogate cannot be encoded by a JSON library that writes UTF-8."""
    body = tiny_job(dataset, name="ok")
    raw = '"x' + bad + 'y"'
    if where == "key":
        text = '{"x' + bad + 'y": 1, ' + _json(body)[1:]
    else:
        parts = where.split(".")
        holder = body
        for p in parts[:-1]:
            holder = holder[p]
        holder[parts[-1]] = "@@BAD@@"
        text = _json(body).replace('"@@BAD@@"', raw)
    for path in ("/api/jobs", "/api/plan"):
        resp = client.post(path, content=text.encode(), headers={"content-type": "application/json"})
        assert resp.status_code == 422, (path, resp.status_code, resp.text)
        assert "x" + bad not in resp.text and ("NUL" in resp.text or "surrogate" in resp.text)
    assert client.get("/api/jobs").json()["total"] == 0


def _json(value) -> str:
    import json

    return json.dumps(value)


def test_an_output_folder_the_job_could_not_write_is_a_422(client, dataset, tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    try:
        cases = {
            str(a_file): "is a file",
            str(a_file / "below"): "is a file",
        }
        if os.geteuid() != 0:  # root writes anywhere: the read-only case only holds for other users
            cases[str(read_only / "run")] = "not writable"
        for value, words in cases.items():
            resp = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": value})
            assert ["body", "output_dir"] in detail_locs(resp) and words in resp.text, (value, resp.text)
    finally:
        read_only.chmod(0o700)
    assert client.get("/api/jobs").json()["total"] == 0


def test_an_output_folder_without_room_for_the_checkpoints_and_export_is_a_422(client, dataset, tmp_path):
    """qwen3-0.6b's checkpoints take 12 B/param (7.2 GB) each: keeping more of them than the test disk has room
    for is refused at submission, naming output_dir and the room it needs, before anything is queued."""
    import shutil

    free = shutil.disk_usage(tmp_path).free
    keep = int(free / (12 * 596049920)) + 2
    body = {
        **tiny_job(dataset, model="qwen3-0.6b"),
        "output_dir": str(tmp_path / "big"),
        "checkpoint": {"interval": 1, "keep": keep},
    }
    resp = client.post("/api/jobs", json=body)
    assert detail_locs(resp) == [["body", "output_dir"]], resp.text
    assert "GiB is free" in resp.text and str(tmp_path) in resp.text
    body["checkpoint"]["keep"] = 1
    assert client.post("/api/plan", json=body).status_code == 200
    assert client.get("/api/jobs").json()["total"] == 0


def test_the_openapi_job_schema_refuses_what_the_api_refuses(client):
    doc = client.get("/openapi.json").json()
    job = doc["components"]["schemas"]["JobCreate"]["properties"]
    assert job["model"]["pattern"] == r"\S"  # blank is refused
    assert job["steps"]["maximum"] == 10**9
    assert job["seed"]["maximum"] == 2**63 - 1 and job["seed"]["minimum"] == 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path.startswith("/api"):
                assert "401" in op["responses"], (method, path)
            if "{job_id}" in path:
                assert "404" in op["responses"], (method, path)
            if "requestBody" in op:
                assert {"400", "413", "422"} <= set(op["responses"]), (method, path)
    assert "409" in doc["paths"]["/api/jobs"]["post"]["responses"]
    assert "409" in doc["paths"]["/api/jobs/{job_id}"]["delete"]["responses"]
