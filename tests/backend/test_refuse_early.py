"""What would only fail once a job or a generation ran is refused before anything is queued: a 422 naming the
field, saying why and what to do, from POST /api/jobs and among POST /api/plan's problems (real API, Redis and
worker; tiny model on the CPU)."""

from __future__ import annotations

import json
import random

import pytest
from backend_support import tiny_job, wait_status

pytestmark = pytest.mark.timeout(300)


def sft_job(dataset, **overrides) -> dict:
    """The tiny model on the shipped supervised demo: its export carries the tiny tokenizer."""
    return tiny_job(dataset, data={"path": "demo:demo_sft.jsonl", "format": "prompt_completion"}, **overrides)


@pytest.fixture(scope="module")
def finished(client, worker, dataset) -> dict:
    """A completed tiny-qwen3 job with an export and a checkpoint of each of its 2 steps."""
    job = client.post("/api/jobs", json=sft_job(dataset, steps=2, checkpoint={"interval": 1, "keep": 2})).json()
    done = wait_status(client, job["id"], ("completed", "failed"), timeout=240)
    assert done["status"] == "completed", done["error"]
    return done


def job_count(client) -> int:
    return client.get("/api/jobs").json()["total"]


def refused(client, body: dict) -> dict[tuple, str]:
    """POST /api/jobs's 422 as {loc: msg}, after checking that nothing was queued."""
    before = job_count(client)
    resp = client.post("/api/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert job_count(client) == before
    return {tuple(e["loc"]): e["msg"] for e in resp.json()["detail"]}


def test_seq_len_of_one_token_is_refused_at_seq_len(client, dataset):
    body = tiny_job(dataset, data={"path": "demo:demo_text.jsonl", "format": "text"}, seq_len=1)
    found = refused(client, body)
    assert list(found) == [("body", "seq_len")]
    assert found[("body", "seq_len")].startswith("must be at least 2, got 1: ")
    assert "no usable rows" in found[("body", "seq_len")]
    plan = client.post("/api/plan", json=body)
    assert plan.status_code == 422 and [e["loc"] for e in plan.json()["detail"]] == [["body", "seq_len"]]


def test_a_dataset_whose_only_bad_record_is_its_last_line_is_refused(client, dataset, tmp_path):
    rng = random.Random(3)
    path = tmp_path / "tokens.jsonl"
    with open(path, "w") as fh:
        for _ in range(3000):
            fh.write(json.dumps({"input_ids": [rng.randrange(3, 512) for _ in range(32)]}) + "\n")
        fh.write(json.dumps({"input_ids": [rng.randrange(3, 512) for _ in range(32)], "labels": "secret"}) + "\n")
    body = tiny_job(path)
    found = refused(client, body)
    assert found == {("body", "data", "path"): f"{path} line 3001: field 'labels' must be a list of integers "
                     "(-100 = ignored)"}
    plan = client.post("/api/plan", json=body)
    assert plan.status_code == 200, plan.text
    assert plan.json()["feasible"] is False
    assert plan.json()["problems"] == [{"loc": "data.path", "msg": found[("body", "data", "path")]}]


def test_init_from_a_job_of_another_model_shape_is_refused(client, finished, dataset):
    body = tiny_job(dataset, model="tiny-llama", init_from={"job": finished["id"], "checkpoint": "latest"})
    found = refused(client, body)
    msg = found[("body", "init_from", "job")]
    assert msg.startswith(f"checkpoint step-00000002 of job {finished['id']} was written for another model shape "
                          "('tiny-qwen3': ")
    assert "set model to 'tiny-qwen3', or start from a job of model 'tiny-llama'" in msg
    plan = client.post("/api/plan", json=body).json()
    assert {"loc": "init_from.job", "msg": msg} in plan["problems"] and plan["feasible"] is False
    same = client.post("/api/plan", json={**body, "model": "tiny-qwen3"}).json()
    assert same["problems"] == [], same["problems"]  # the same shape starts from it


def test_a_prompt_longer_than_the_model_s_context_is_refused(client, finished):
    url = f"/api/jobs/{finished['id']}/generate"
    long = "the quick brown fox jumps over the lazy dog " * 400  # 17,600 characters, over 1,024 tokens
    for checkpoint in (None, "step-00000002"):
        resp = client.post(url, json={"prompt": long, "checkpoint": checkpoint})
        assert resp.status_code == 422, resp.text
        [error] = resp.json()["detail"]
        assert error["loc"] == ["body", "prompt"]
        assert "more than the 1024 positions the model takes (max_position_embeddings)" in error["msg"]
        assert "shorten the prompt to at most about 960 tokens" in error["msg"]
    # A prompt that fits, but not with the new tokens asked for: the message says to ask for fewer.
    resp = client.post(url, json={"prompt": "the quick brown fox " * 100, "max_new_tokens": 1024})
    assert resp.status_code == 422 and "ask for fewer new tokens" in resp.text
    ok = client.post(url, json={"prompt": "3 + 4 =", "max_new_tokens": 1})
    assert ok.status_code == 202, ok.text
