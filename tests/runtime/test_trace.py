"""The step timeline a rank writes when SLIDEDP_TRACE names a folder (slidedp.step.trace)."""

from __future__ import annotations

import json

from slidedp.launch import train
from slidedp.model_sizing import shape_of
from slidedp.presets import PRESETS
from slidedp.step import trace

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
        assert sorted(r["step"] for r in rows if r["kind"] == "updates_issued") == [1, 2, 3]
        waits = [r for r in rows if r["kind"] == "wait_update"]
        assert all(r["t1"] >= r["t0"] and r["unit"] in units[1] for r in waits)
        # every decoder layer's forward and backward, once a step, inside the step's spans, in the window's order
        [run] = [r for r in rows if r["kind"] == "run"]
        layers = len(run["activations"])
        assert run["compiled"] is False and layers >= 2
        # one layer's forward over one micro-batch (2 x 32 tokens of tiny-qwen3), for the report's FLOP rates
        shape = shape_of(PRESETS["tiny-qwen3"])
        qd, kvd = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        matmul = 2.0 * 2 * 32 * (2 * shape.hidden * qd + 2 * shape.hidden * kvd + 3 * shape.hidden * shape.intermediate)
        assert run["layer_forward_flops"] == {"matmul": matmul, "attention": 2.0 * 2 * 32 * 32 * qd}
        gpu = {r["step"]: r for r in rows if r["kind"] == "gpu"}
        for step in (1, 2, 3):
            fwd = [r for r in rows if r["kind"] == "layer" and r["step"] == step and r["dir"] == "forward"]
            bwd = [r for r in rows if r["kind"] == "layer" and r["step"] == step and r["dir"] == "backward"]
            assert [r["unit"] for r in fwd] == list(range(1, layers + 1))
            assert [r["unit"] for r in bwd] == list(range(layers, 0, -1))
            assert all(r["act"] == run["activations"][r["unit"] - 1] and r["mb"] == 0 for r in fwd + bwd)
            g = gpu[step]
            assert all(g["start"] <= r["ready"] <= r["end"] <= g["forward_end"] for r in fwd), (fwd, g)
            assert all(g["forward_end"] <= r["ready"] <= r["end"] <= g["backward_end"] for r in bwd), (bwd, g)


def test_a_second_run_in_the_same_folder_keeps_the_first_ones_timeline(tmp_path):
    folder = str(tmp_path)
    first = trace._free_path(folder, 0)
    assert first.endswith("trace-rank0.jsonl")
    open(first, "w").close()
    assert trace._free_path(folder, 0).endswith("trace-rank0-2.jsonl")
    assert trace._free_path(folder, 1).endswith("trace-rank1.jsonl")  # each rank counts its own files


def test_a_clipped_runs_post_norm_updates_say_how_long_they_were_off_the_cpu(tmp_path, monkeypatch):
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    monkeypatch.setenv("SLIDEDP_TRACE", str(tmp_path / "trace"))
    train(tiny_job(data, str(tmp_path / "out"), steps=2, ranks=1, optimizer={"max_grad_norm": 1.0},
                   policy=HOST_ROUTE_FEW_SLOTS))
    rows = [json.loads(line) for line in open(tmp_path / "trace" / "trace-rank0.jsonl", encoding="utf-8")]
    finals = [r for r in rows if r["kind"] == "final"]
    assert sorted({r["step"] for r in finals}) == [1, 2] and finals
    assert all(0.0 <= r["offcpu"] <= r["t1"] - r["t0"] + 1e-6 for r in finals), finals
    issued = {r["step"]: r["t"] for r in rows if r["kind"] == "updates_issued"}
    backward = {r["step"]: r["t"] for r in rows if r["kind"] == "backward_issued"}
    assert sorted(issued) == [1, 2] and all(issued[s] >= backward[s] for s in issued)
