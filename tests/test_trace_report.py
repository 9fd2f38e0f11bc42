"""scripts/trace_report.py: where the host updater idled, from a step timeline."""

from __future__ import annotations

import importlib.util
import json
import os

_spec = importlib.util.spec_from_file_location(
    "trace_report", os.path.join(os.path.dirname(__file__), "..", "scripts", "trace_report.py"))
trace_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_report)


def test_the_report_splits_the_updaters_idle_time_around_the_next_first_gradient(tmp_path, capsys):
    # step 2's backward ends at 1.0 and step 3's at 2.0; the updater finishes step 2's leftovers (units 1 and 3)
    # by 1.5, the forward of step 3 ends at 1.6 and step 3's first gradient is in hand at 1.7
    rows = [{"kind": "gpu", "step": 2, "start": 0.0, "forward_end": 0.4, "backward_end": 1.0},
            {"kind": "gpu", "step": 3, "start": 1.0, "forward_end": 1.6, "backward_end": 2.0},
            {"kind": "update", "step": 2, "unit": 1, "t0": 1.0, "landed": 1.0, "t1": 1.2},
            {"kind": "update", "step": 2, "unit": 3, "t0": 1.2, "landed": 1.2, "t1": 1.5},
            {"kind": "update", "step": 3, "unit": 4, "t0": 1.65, "landed": 1.7, "t1": 1.9}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [r] = trace_report.report(trace_report.load(str(path)), first=2)
    assert r["step"] == 3 and r["period_s"] == 1.0 and r["leftover_units"] == 2 and r["last_unit_before"] == 3
    assert abs(r["updater_busy_s"] - 0.7) < 1e-9 and abs(r["idle_s"] - 0.3) < 1e-9
    assert abs(r["idle_before_first_gradient_s"] - 0.2) < 1e-9  # 1.5 -> 1.7
    assert abs(r["forward_end_after_last_update_s"] - 0.1) < 1e-9
    assert trace_report.main([str(path), "--from-step", "2"]) == 0
    assert '"median"' in capsys.readouterr().out


def test_the_layer_report_splits_each_pass_into_the_layers_own_time_and_the_time_before_them(tmp_path, capsys):
    # step 1: layer 1 (kept) forward 0.10-0.12, layer 2 (checkpointed) waits for its weights until 0.15, runs to
    # 0.16; backward: layer 2 0.30-0.34, layer 1 ready at 0.35, done 0.38
    rows = [{"kind": "run", "step": 0, "compiled": True, "activations": ["keep", "checkpoint"]},
            {"kind": "gpu", "step": 1, "start": 0.05, "forward_end": 0.2, "backward_end": 0.4},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "forward", "unit": 1, "act": "keep", "ready": 0.10,
             "end": 0.12},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "forward", "unit": 2, "act": "checkpoint", "ready": 0.15,
             "end": 0.16},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "backward", "unit": 2, "act": "checkpoint", "ready": 0.30,
             "end": 0.34},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "backward", "unit": 1, "act": "keep", "ready": 0.35,
             "end": 0.38}]
    calibration = {"unit": {"fwd_keep_s": 0.04}, "unit_compiled": {"fwd_keep_s": 0.01, "fwd_checkpoint_s": 0.02,
                                                                     "bwd_keep_s": 0.03, "bwd_checkpoint_s": 0.04}}
    out = trace_report.layer_report(rows, first=1, calibration=calibration)
    kinds = {(k["dir"], k["act"]): k for k in out["kinds"]}
    fk = kinds[("forward", "keep")]
    assert fk["runs"] == 1 and abs(fk["own_s"] - 0.02) < 1e-9 and fk["before_s"] is None
    assert fk["calibrated_s"] == 0.01 and abs(fk["ratio"] - 2.0) < 1e-9  # the compiled figure: the run compiled
    fc = kinds[("forward", "checkpoint")]
    assert abs(fc["before_s"] - 0.03) < 1e-9 and abs(fc["ratio"] - 0.5) < 1e-9
    bk = kinds[("backward", "keep")]
    assert abs(bk["own_s"] - 0.03) < 1e-9 and abs(bk["before_s"] - 0.01) < 1e-9 and abs(bk["ratio"] - 1) < 1e-9
    [st] = out["steps"]
    assert abs(st["forward_own"] - 0.03) < 1e-9 and abs(st["forward_before"] - 0.03) < 1e-9
    assert abs(st["backward_own"] - 0.07) < 1e-9 and abs(st["backward_before"] - 0.01) < 1e-9
    assert abs(st["forward_span"] - 0.15) < 1e-9 and abs(st["backward_span"] - 0.2) < 1e-9
    path, cal = tmp_path / "t.jsonl", tmp_path / "c.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cal.write_text(json.dumps(calibration))
    assert trace_report.main([str(path), "--layers", "--calibration", str(cal), "--from-step", "1"]) == 0
    assert '"ratio"' in capsys.readouterr().out


def test_the_layer_report_gives_the_compute_phases_flop_rate_model_work_and_recompute_apart(tmp_path, capsys):
    # one layer's forward is 1e12 FLOPs; step 1: a kept layer (forward 2 ms, backward 4 ms) and a checkpointed
    # one (forward 2 ms, backward with its recompute 6 ms)
    rows = [{"kind": "run", "step": 0, "compiled": False, "activations": ["keep", "checkpoint"],
             "layer_forward_flops": {"matmul": 0.9e12, "attention": 0.1e12}},
            {"kind": "gpu", "step": 1, "start": 0.0, "forward_end": 0.01, "backward_end": 0.03},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "forward", "unit": 1, "act": "keep", "ready": 0.001,
             "end": 0.003},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "forward", "unit": 2, "act": "checkpoint", "ready": 0.003,
             "end": 0.005},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "backward", "unit": 2, "act": "checkpoint", "ready": 0.011,
             "end": 0.017},
            {"kind": "layer", "step": 1, "mb": 0, "dir": "backward", "unit": 1, "act": "keep", "ready": 0.017,
             "end": 0.021}]
    flops = trace_report.forward_flops(rows)
    assert flops == 1e12
    out = trace_report.layer_report(rows, first=1, flops=flops)
    kinds = {(k["dir"], k["act"]): k for k in out["kinds"]}
    assert abs(kinds[("forward", "keep")]["model_tflops"] - 500) < 1e-6  # 1e12 in 2 ms
    assert abs(kinds[("backward", "keep")]["model_tflops"] - 500) < 1e-6  # 2e12 in 4 ms
    bc = kinds[("backward", "checkpoint")]
    assert abs(bc["model_tflops"] - 2e12 / 0.006 / 1e12) < 1e-6 and abs(bc["work_tflops"] - 500) < 1e-6
    [st] = out["steps"]
    # the model's work: 1 + 1 + 2 + 2 forwards; done: one more (the recompute); over 14 ms of the layers' own time
    assert abs(st["model_tflops"] - 6e12 / 0.014 / 1e12) < 1e-6 and abs(st["work_tflops"] - 7e12 / 0.014 / 1e12) < 1e-6
    assert out["median"]["model_tflops"] == st["model_tflops"]
    assert "model_tflops" not in trace_report.layer_report(rows, first=1)["steps"][0]  # no FLOPs: no rate
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trace_report.main([str(path), "--layers", "--from-step", "1"]) == 0
    assert '"median"' in capsys.readouterr().out


def test_a_timeline_without_the_layers_flops_takes_them_from_the_model_named():
    from slidedp.model_sizing import layer_forward_flops, shape_of
    from slidedp.presets import PRESETS

    rows = [{"kind": "run", "step": 0, "compiled": True, "activations": ["keep"]}]
    assert trace_report.forward_flops(rows) is None
    got = trace_report.forward_flops(rows, "qwen3-8b", 8, 2048)
    # Qwen3-8B: hidden 4096, 32 query and 8 KV heads of 128, MLP 12288; 8 x 2048 tokens
    tokens, h = 8 * 2048, 4096
    matmul = 2.0 * tokens * (2 * h * 4096 + 2 * h * 1024 + 3 * h * 12288)
    attention = 2.0 * 8 * 2048 * 2048 * 4096
    assert got == matmul + attention
    assert sum(layer_forward_flops(shape_of(PRESETS["qwen3-8b"]), 8, 2048)) == got
