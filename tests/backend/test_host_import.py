"""Imported hosts: the Hosts page imports the file `slidedp topology --save` wrote on a GPU host (POST
/api/hosts/import), lists it as imported, and POST /api/plan plans for it from its own topology and calibrations
while POST /api/jobs refuses to queue a job there (no worker). Real API over HTTP, the shipped two-H200 figures."""

from __future__ import annotations

import json
import os

import pytest
from backend_support import tiny_job, tokens_dataset
from slidedp.planning import host_file

FIX = os.path.join(os.path.dirname(__file__), "..", "runtime", "fixtures")


def saved_x2() -> dict:
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        topo = json.load(fh)["nvlink"]
    with open(os.path.join(FIX, "h200x2_calibration.json")) as fh:
        cals = list(json.load(fh).values())
    return host_file.build(topo, cals).to_dict()


def qwen3_8b(dataset, **over):
    job = {"model": "qwen3-8b", "gpus": 2, "micro_batch_size": 8, "seq_len": 2048, "precision": "bf16", **over}
    return {k: v for k, v in tiny_job(dataset, **job).items() if k != "ranks"}


@pytest.mark.slow
def test_an_imported_two_h200_host_plans_qwen3_8b_and_never_takes_a_job(client, module_dir):
    dataset = tokens_dataset(module_dir / "tokens-2048.jsonl", rows=8, seq_len=2048)
    saved = saved_x2()
    resp = client.post("/api/hosts/import", params={"file": "h200x2.json"}, json=saved)
    assert resp.status_code == 201, resp.text
    name = "imported:" + saved["name"]
    assert resp.json() == {"name": name, "saved_at": saved["saved_at"], "gpus": 2, "calibrations": 3}

    listed = {h["name"]: h for h in client.get("/api/hosts").json()["items"]}
    host = listed[name]
    assert host["online"] is False and len(host["topology"]["gpus"]) == 2
    assert host["topology"]["imported"]["file"] == "h200x2.json"
    assert host["topology"]["imported"]["saved_at"] == saved["saved_at"]
    assert len(host["calibration"]["entries"]) == 3

    plan = client.post("/api/plan", json=qwen3_8b(dataset, host=name))
    assert plan.status_code == 200, plan.text
    body = plan.json()
    assert body["host"] == name and body["fits"] is True
    assert body["calibration"] == "measured" and body["predicted"]["step_time_s"] > 0
    assert body["calibration_match"]["used"]["key"] == "fixture-qwen3-8b-bs8-nvlink"
    assert body["policy"]["grad_reduce"] == "gpu"

    job = client.post("/api/jobs", json=qwen3_8b(dataset, host=name))
    assert job.status_code == 422, job.text
    assert any(e["loc"] == ["body", "host"] and "imported host" in e["msg"] and "no worker" in e["msg"]
               for e in job.json()["detail"]), job.text

    again = client.post("/api/hosts/import", params={"file": "h200x2-new.json"}, json=saved)
    assert again.status_code == 201  # importing the same host again replaces it
    hosts = [h for h in client.get("/api/hosts").json()["items"] if h["name"] == name]
    assert len(hosts) == 1 and hosts[0]["topology"]["imported"]["file"] == "h200x2-new.json"


def test_a_file_that_is_not_a_saved_host_is_refused_with_what_is_wrong(client):
    before = client.get("/api/hosts").json()["items"]
    topology_only = saved_x2()["topology"]  # `slidedp topology` without --save: no kind, no calibrations
    resp = client.post("/api/hosts/import", json=topology_only)
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert 'needs "kind": "slidedp-host"' in err["msg"] and "slidedp topology --save" in err["msg"]

    broken = {**saved_x2(), "calibrations": [{"shape": {}, "device": "tpu"}]}
    resp = client.post("/api/hosts/import", json=broken)
    assert resp.status_code == 422 and "calibrations[0]" in resp.json()["detail"][0]["msg"]

    resp = client.post("/api/hosts/import", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "not JSON" in resp.json()["detail"][0]["msg"]

    huge = b'{"kind": "slidedp-host", "pad": "' + b"x" * (host_file.MAX_BYTES + 10) + b'"}'
    resp = client.post("/api/hosts/import", content=huge, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "too large" in resp.text
    assert client.get("/api/hosts").json()["items"] == before  # nothing refused was stored
