"""Declared hosts in the API: GET /api/profiles lists the shipped hardware profiles, and POST /api/plan with
`profile` plans for one of them instead of a reported host, by name only (never a path). Real API over HTTP."""

from __future__ import annotations

from backend_support import tiny_job
from slidedp.planning import profiles


def qwen3_4b(dataset, **over):
    job = {"model": "qwen3-4b", "gpus": 1, "micro_batch_size": 4, "seq_len": 2048, "precision": "bf16", **over}
    return {k: v for k, v in tiny_job(dataset, **job).items() if k != "ranks"}


def test_profiles_lists_every_shipped_profile_with_its_headline_figures(client):
    resp = client.get("/api/profiles")
    assert resp.status_code == 200, resp.text
    items = {p["name"]: p for p in resp.json()["items"]}
    assert set(items) == set(profiles.shipped())
    r4090 = items["1x-rtx4090-128g"]
    assert r4090["gpus"] == 1 and r4090["gpu_memory_gib"] == 24 and r4090["pcie"] == "Gen4 x16"
    assert r4090["host_ram_gib"] == 128 and r4090["bf16_dense_tflops"] == 165.2
    assert items["2x-rtx4090-128g"]["p2p"] is False
    assert "RTX 4090" in r4090["description"]


def test_plan_with_a_profile_is_made_for_the_declared_host(client, dataset):
    resp = client.post("/api/plan", json=qwen3_4b(dataset, profile="1x-rtx4090-128g"))
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert plan["fits"] is True
    assert plan["host"] == "declared:1x-rtx4090-128g"
    assert plan["declared"]["profile"] == "1x-rtx4090-128g"
    assert plan["calibration"] == "declared"
    assert "not measured" in plan["calibration_note"]
    assert plan["calibration_match"]["declared"]["profile"] == "1x-rtx4090-128g"
    assert plan["predicted"]["step_time_s"] > 0
    assert 20 < plan["job"]["hbm_card_gib"] <= 24 and plan["job"]["host_limit_gib"] == 128
    # a bigger card plans the same job faster, from its own declared figures
    l40s = client.post("/api/plan", json=qwen3_4b(dataset, profile="1x-l40s-256g")).json()
    assert l40s["predicted"]["step_time_s"] < plan["predicted"]["step_time_s"]


def test_a_profile_caps_what_the_job_may_ask_of_the_host(client, dataset):
    two = client.post("/api/plan", json=qwen3_4b(dataset, gpus=2, profile="1x-rtx4090-128g"))
    assert two.status_code == 200
    assert any(p["loc"] == "gpus" and "declared host 1x-rtx4090-128g has 1" in p["msg"]
               for p in two.json()["problems"])
    ram = client.post("/api/plan", json=qwen3_4b(dataset, host_ram_gib=200, profile="1x-rtx4090-128g"))
    assert ram.status_code == 422
    assert ["body", "host_ram_gib"] in [e["loc"] for e in ram.json()["detail"]]


def test_an_unknown_profile_is_422_naming_the_shipped_ones(client, dataset):
    resp = client.post("/api/plan", json=qwen3_4b(dataset, profile="rtx-9090"))
    assert resp.status_code == 422, resp.text
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "profile"]
    for name in profiles.shipped():
        assert name in err["msg"]


def test_a_profile_path_is_refused_and_never_read(client, dataset, tmp_path):
    own = tmp_path / "mine.json"
    shipped = profiles.load("1x-rtx4090-128g")
    own.write_text('{"name": "mine"}')
    for given in (str(own), "../assets/profiles/1x-rtx4090-128g.json", shipped["source"], 7):
        resp = client.post("/api/plan", json=qwen3_4b(dataset, profile=given))
        assert resp.status_code == 422, (given, resp.text)
        assert resp.json()["detail"][0]["loc"] == ["body", "profile"]
    both = client.post("/api/plan", json=qwen3_4b(dataset, profile="1x-l4-64g", host="somewhere"))
    assert both.status_code == 422 and "not both" in both.json()["detail"][0]["msg"]


def test_a_job_cannot_be_created_on_a_declared_host(client, dataset):
    resp = client.post("/api/jobs", json=tiny_job(dataset, profile="1x-rtx4090-128g"))
    assert resp.status_code == 422
    assert ["body", "profile"] in [e["loc"] for e in resp.json()["detail"]]
