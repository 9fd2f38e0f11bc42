"""cost_model.IN_STEP_BACKWARD: a decoder layer's backward on a GPU is charged as the step timelines measured it
inside the step, not as calibration timed it alone; the factor is the median of the timelines kept under
docs/results, and a CPU job's layers are charged as calibrated."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import statistics

import pytest
from slidedp.config import JobConfig
from slidedp.planning import cost_model as cm
from slidedp.planning.job import Job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
_spec = importlib.util.spec_from_file_location("trace_report", os.path.join(ROOT, "scripts", "trace_report.py"))
trace_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_report)

# (timeline, the calibration its run planned with): every GPU timeline kept with its session's calibration
TIMELINES = [
    ("s21/pair4-trace/trace-rank0.jsonl", "s21/calibration/vm-bf51d61850786b46.json"),
    ("s21/pair4-trace/trace-rank0-2.jsonl", "s21/calibration/vm-bf51d61850786b46.json"),
    ("s21/comp8-trace/trace-rank0.jsonl", "s21/calibration/vm-48bf2a4ce538419b.json"),
    ("s21/comp8-trace/trace-rank0-2.jsonl", "s21/calibration/vm-48bf2a4ce538419b.json"),
    ("s22/passes4-trace/trace-rank0-2.jsonl", "s22/calibration/vm-68b061e8b1b7faf5.json"),
    ("s22/passes4-trace/trace-rank0-3.jsonl", "s22/calibration/vm-68b061e8b1b7faf5.json"),
    ("s23/pair4-trace/trace-rank0.jsonl", "s23/calibration/vm-68b061e8b1b7faf5.json"),
    ("s23/pair4-trace/trace-rank0-2.jsonl", "s23/calibration/vm-68b061e8b1b7faf5.json"),
    ("s25/pair4-trace/trace-rank0.jsonl", "s25/calibration/vm-68b061e8b1b7faf5.json"),
    ("s25/pair4-trace/trace-rank0-2.jsonl", "s25/calibration/vm-68b061e8b1b7faf5.json"),
    ("s27/t/base-1.jsonl", "s27/calibration/vm-68b061e8b1b7faf5.json"),
    ("s27/t/new-1.jsonl", "s27/calibration/vm-68b061e8b1b7faf5.json"),
    ("s27/t/base-2.jsonl", "s27/calibration/vm-68b061e8b1b7faf5.json"),
]


def _backward_ratios(timelines: list[tuple[str, str]]) -> list[float]:
    """Each timeline's layers' backward over its calibrated time, per activation kind (trace_report --layers)."""
    out = []
    for timeline, calibration in timelines:
        with open(os.path.join(RESULTS, calibration)) as fh:
            cal = json.load(fh)
        rep = trace_report.layer_report(trace_report.load(os.path.join(RESULTS, timeline)), 3, cal)
        out += [k["ratio"] for k in rep["kinds"] if k["dir"] == "backward" and "ratio" in k]
    return out


def test_the_factor_is_the_median_of_the_kept_timelines():
    ratios = _backward_ratios(TIMELINES)
    assert len(ratios) >= len(TIMELINES)  # each timeline gave its checkpointed (and kept) layers' backward
    assert all(1.0 < r < 1.12 for r in ratios), ratios  # never faster in the step than alone
    assert cm.IN_STEP_BACKWARD == pytest.approx(statistics.median(ratios), abs=0.01)


def _rates(gpus: int) -> tuple[cm.Rates, dict]:
    with open(os.path.join(RESULTS, "s25", "calibration", "vm-68b061e8b1b7faf5.json")) as fh:
        cal = json.load(fh)
    with open(os.path.join(RESULTS, "s25", "topology.json")) as fh:
        topo = json.load(fh)
    cfg = JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": gpus, "micro_batch_size": 4,
                               "seq_len": 2048})
    if not gpus:
        cal = copy.deepcopy(cal)
        cal["device"] = "cpu"
    return cm.Rates(cal, Job.from_config(cfg, topo)), cal["unit"]


def test_a_gpu_layers_backward_is_charged_as_in_the_step_and_its_forward_as_calibrated():
    rates, unit = _rates(1)
    fwd, bwd = rates.layer_s()
    assert bwd["checkpoint"] == pytest.approx(unit["bwd_checkpoint_s"] * cm.IN_STEP_BACKWARD)
    assert bwd["keep"] == bwd["offload"] == pytest.approx(unit["bwd_keep_s"] * cm.IN_STEP_BACKWARD)
    assert fwd["checkpoint"] == unit["fwd_checkpoint_s"] and fwd["keep"] == unit["fwd_keep_s"]


def test_a_cpu_jobs_layers_are_charged_as_calibrated():
    rates, unit = _rates(0)
    _, bwd = rates.layer_s()
    assert bwd["checkpoint"] == unit["bwd_checkpoint_s"] and bwd["keep"] == unit["bwd_keep_s"]


def test_a_timeline_measured_after_the_factor_was_chosen_agrees_with_it():
    # s28: Qwen3-8B micro-batch 8 on the whole card of an H100 machine, a shape and machine no timeline above had,
    # run after IN_STEP_BACKWARD was set: its layers' backward (checkpointed in both rows, kept in the clipped one)
    for name in ("trace-rank0.jsonl", "trace-rank0-2.jsonl"):
        ratios = _backward_ratios([(f"s28/pair8-trace/{name}", "s28/calibration/vm-ed4e2e9809270b42.json")])
        assert ratios and all(abs(r - cm.IN_STEP_BACKWARD) <= 0.03 for r in ratios), (name, ratios)


def test_the_h100_rows_are_planned_apart_with_their_own_sessions_calibrations():
    """scripts/prediction_check.py --set h100: the rows of the H100 machines, never in the H200 sets, each
    planned with a calibration of its own session (no other session's stands in)."""
    from scripts import prediction_check as pc

    h100 = pc.measured_rows("h100")
    assert len(h100) >= 20 and {pc.session_of(r["path"]) for r in h100} <= set(pc.H100_SESSIONS)
    assert not {r["source"] for r in h100} & {r["source"] for r in pc.measured_rows("all")}
    for row in h100:
        name, _, stand_in = pc.calibration_for(row, row["path"])
        assert not stand_in and name.split("/")[0] == pc.session_of(row["path"]), (row["source"], name)
