"""The step timeline a rank writes when SLIDEDP_TRACE names a folder (slidedp.step.trace)."""

from __future__ import annotations

import json

from slidedp.launch import train

from tests.runtime.exactness import HOST_ROUTE_FEW_SLOTS, make_pattern_data, tiny_job


def test_a_traced_run_writes_each_ranks_steps_updates_and_waits_on_one_clock(tmp_path, monkeypatch):
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    monkeypatch.setenv("SLIDEDP_TRACE", str(tmp_path / "trace"))
    train(tiny_job(data, str(tmp_path / "out"), steps=3, ranks=2, optimizer={"max_grad_norm": 0.0},
                   policy=HOST_ROUTE_FEW_SLOTS))
    for rank in (0, 1):
        rows = [json.loads(line) for line in open(tmp_path / "trace" / f"trace-rank{rank}.jsonl", encoding="utf-8")]
        kinds = {r["kind"] for r in rows}
        assert {"step", "gpu", "backward_issued", "update"} <= kinds, kinds
        steps = {r["step"]: r["t"] for r in rows if r["kind"] == "step"}
        assert sorted(steps) == [1, 2, 3]
        units = {}
        for r in rows:
            if r["kind"] == "update":
                assert r["t0"] <= r["landed"] <= r["t1"], r
                assert r["t0"] >= steps[r["step"]], r  # a gradient comes after its step began
                units.setdefault(r["step"], []).append(r["unit"])
            if r["kind"] == "gpu":
                assert r["start"] <= r["forward_end"] <= r["backward_end"], r
        # tiny-qwen3: embedding, its layers and the head, every one updated on the host once a step
        assert all(sorted(u) == sorted(units[1]) and len(set(u)) == len(u) for u in units.values())
        assert sorted(units) == [1, 2, 3] and 0 in units[1]
        waits = [r for r in rows if r["kind"] == "wait_update"]
        assert all(r["t1"] >= r["t0"] and r["unit"] in units[1] for r in waits)
