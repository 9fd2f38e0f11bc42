"""Small API rules, each against the real server (and Redis, and for the export a real worker): a deleted job's
id is never given to another, the SSE cursor header is held to the query parameter's rule, a body nested past
the parser's depth says so, and an exported file replaced by one of the same size is not served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backend_support import tiny_job, wait_status

pytestmark = pytest.mark.timeout(300)


def test_the_newest_job_s_id_is_not_given_again_after_it_is_deleted(client, dataset):
    first = client.post("/api/jobs", json=tiny_job(dataset)).json()
    assert client.delete(f"/api/jobs/{first['id']}").status_code == 204
    second = client.post("/api/jobs", json=tiny_job(dataset)).json()
    assert second["id"] == first["id"] + 1
    assert client.get(f"/api/jobs/{first['id']}").status_code == 404
    client.delete(f"/api/jobs/{second['id']}")


@pytest.fixture
def ended_job(client, dataset) -> dict:
    """A job cancelled while queued: terminal, with its events 'queued' and 'cancelled'."""
    job = client.post("/api/jobs", json=tiny_job(dataset)).json()
    client.post(f"/api/jobs/{job['id']}/cancel")
    assert client.get(f"/api/jobs/{job['id']}").json()["status"] == "cancelled"
    yield job
    client.delete(f"/api/jobs/{job['id']}")


@pytest.mark.parametrize("header", ["abc", str(2**66), "-1", "1e3"])
def test_a_last_event_id_header_that_is_not_an_event_id_is_a_422(client, ended_job, header):
    url = f"/api/jobs/{ended_job['id']}/events"
    with client.stream("GET", url, headers={"Last-Event-ID": header}) as resp:
        resp.read()
    assert resp.status_code == 422, (resp.status_code, resp.text)
    [error] = resp.json()["detail"]
    assert error["loc"] == ["header", "Last-Event-ID"]
    assert "Last-Event-ID must be the id of an event this stream sent (an integer from 0 to " in error["msg"]
    query = client.get(url, params={"last_event_id": header})  # the query parameter's rule, and its error type
    assert query.status_code == 422 and query.json()["detail"][0]["type"] == error["type"]


def test_a_valid_last_event_id_header_still_resumes_after_it(client, ended_job):
    url = f"/api/jobs/{ended_job['id']}/events"
    with client.stream("GET", url, headers={"Last-Event-ID": "1"}) as resp:
        body = resp.read().decode()
    assert resp.status_code == 200 and "id: 2" in body and "id: 1\r" not in body and "id: 1\n" not in body
    assert client.get(url, headers={"Last-Event-ID": "2"}).status_code == 204


def test_a_body_nested_100k_deep_says_it_nests_too_deeply(client):
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/api/jobs", "/api/plan"):
        resp = client.post(path, content=deep, headers={"Content-Type": "application/json"})
        assert resp.status_code == 422, resp.text
        [error] = resp.json()["detail"]
        assert error["loc"] == ["body"] and "the JSON nests too deeply to be read" in error["msg"]
        assert "UTF-8" not in resp.text
    latin1 = client.post("/api/jobs", content='{"name": "caf\xe9"}'.encode("latin-1"),
                         headers={"Content-Type": "application/json"})
    assert latin1.status_code == 400 and "JSON must be UTF-8 encoded" in latin1.json()["detail"]


@pytest.mark.slow  # trains and exports a job: part of make test
def test_an_exported_file_replaced_by_one_of_the_same_size_is_a_409(client, dataset, worker):
    job = client.post("/api/jobs", json=tiny_job(dataset, steps=2)).json()
    assert wait_status(client, job["id"], ("completed", "failed"), timeout=240)["status"] == "completed"
    url = f"/api/jobs/{job['id']}/export"
    assert client.get(url).status_code == 200
    config = Path(job["output_dir"]) / "final" / "config.json"
    before = os.stat(config)
    text = config.read_text()
    swapped = text.replace('"', "'", 1) if '"' in text else text[::-1]
    assert len(swapped.encode()) == len(text.encode()) and swapped != text
    # Rewritten in place with the same size, its modification time set back as `touch -d` would.
    with open(config, "r+") as fh:
        fh.write(swapped)
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(config).st_size == before.st_size and os.stat(config).st_mtime_ns == before.st_mtime_ns
    resp = client.get(url)
    assert resp.status_code == 409, resp.status_code
    assert "config.json' is no longer the file the export wrote (replaced or rewritten since)" in resp.json()["detail"]


def test_a_model_directory_whose_config_leaves_keys_to_their_defaults_is_planned(client, dataset, module_dir):
    """A Llama config.json without num_key_value_heads or head_dim (transformers: as many KV heads as heads,
    hidden / heads wide) is a model the run builds; the plan preview sizes it as such instead of refusing it as a
    model it "cannot size"."""
    import json

    model = module_dir / "llama-defaults"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 512}))
    (model / "model.safetensors").write_bytes(b"")  # the request's checks look for weights by name only
    plan = client.post("/api/plan", json=tiny_job(dataset, model=str(model))).json()
    assert plan["feasible"], plan["errors"]
    layer = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k, v, o (4 KV heads of 16), the MLP and two norms
    assert plan["job"]["params"] == 512 * 64 + 2 * layer + 64 + 512 * 64
