"""POST /api/plan answers with the plan's card sweep, which the plan preview shows as "What a different card would
buy": on a declared 48 GiB card (timed from the profile's figures), 16 and 24 GiB and the whole card, the job's own
row marked. Real API over HTTP."""

from __future__ import annotations

from backend_support import tiny_job


def test_the_plan_preview_carries_the_card_sweep(client, dataset):
    job = {"model": "qwen3-4b", "gpus": 1, "micro_batch_size": 4, "seq_len": 2048, "precision": "bf16",
           "profile": "1x-l40s-256g"}
    resp = client.post("/api/plan", json={k: v for k, v in tiny_job(dataset, **job).items() if k != "ranks"})
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    rows = plan["card_sweep"]
    card = plan["job"]["hbm_card_gib"]
    assert [r["hbm_gib"] for r in rows] == [s for s in (16, 24, 48, 80) if s < card] + [card]
    whole = rows[-1]
    assert whole["whole_card"] and whole["current"] and plan["job"]["hbm_cap_gib"] is None
    assert whole["step_time_s"] == plan["predicted"]["step_time_s"] > 0
    times = [r["step_time_s"] for r in rows if r["fits"]]
    assert times and all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))
    assert all(r["why_not"] for r in rows if not r["fits"])
