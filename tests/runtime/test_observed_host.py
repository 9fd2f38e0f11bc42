"""A run's steady steps against its prediction, and the host factor a GPU run observes, kept with the calibration
its plan was priced with, which prices no plan (slidedp.planning.observed)."""

from __future__ import annotations

import copy
import json
import os
from concurrent.futures import Future

import pytest
from slidedp.config import JobConfig
from slidedp.planning import calibration as calib
from slidedp.planning import observed
from slidedp.planning.autopolicy import plan_job
from slidedp.planning.basis import calibration_digest, plan_basis
from slidedp.planning.cost_model import Rates
from slidedp.planning.job import Job
from slidedp.planning.plan_json import metrics_prediction
from slidedp.planning.report import format_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _measured(**over) -> tuple[dict, dict, JobConfig]:
    """The s17 calibration of Qwen3-4B at micro-batch 4 (a measured one-GPU record), a one-GPU host and the job."""
    with open(os.path.join(ROOT, "docs", "results", "s17", "calibration", "vm-3f733d50e10c1aa8.json")) as fh:
        cal = json.load(fh)
    with open(os.path.join(ROOT, "tests", "runtime", "fixtures", "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    s = cal["shape"]
    cfg = JobConfig.from_dict(
        {
            "model": s["model"],
            "data": {"path": "x.jsonl"},
            "gpus": 1,
            "seq_len": s["seq"],
            "micro_batch_size": s["micro_batch"],
            "cpu_threads": 16,
            "precision": "bf16",
            "gpu_memory_gib": 24,
            "optimizer": {"max_grad_norm": 1.0},
            **over,
        }
    )
    return cal, topo, cfg


def _record(step: int, step_s: float, busy: float, predicted: dict) -> dict:
    return {
        "step": step,
        "step_time_s": step_s,
        "predicted": predicted,
        "phases": {"forward": 0.2, "backward": step_s - 0.2, "update_busy": busy},
    }


PRED = {"step_time_s": 1.0, "forward_span": 0.2, "backward_span": 0.8, "update_busy": 0.5}


def test_the_check_takes_the_steady_steps_medians_and_names_a_slower_host():
    # two start-up steps (far off), then steady ones: the step 16% over, the host updater busy 1.3x its charge
    records = [_record(1, 5.0, 3.0, PRED), _record(2, 2.0, 1.0, PRED)]
    records += [_record(s, 1.16 + 0.01 * (s % 2), 0.65, PRED) for s in range(3, 10)]
    check = observed.prediction_check(records)
    assert check["steps"] == [3, 9]
    assert check["step_time"]["measured_s"] == pytest.approx(1.17)
    assert check["step_time"]["ratio"] == pytest.approx(1.17)
    assert check["host_update"]["ratio"] == pytest.approx(1.3)
    assert check["prediction_error"] == pytest.approx(1 / 1.17 - 1)
    assert "median step 1.170 s, predicted 1.000 s (-14.5%)" in check["message"]
    assert check["message"].endswith(": the host update ran 1.30x the time the plan charged")
    assert observed.host_observation(check) == pytest.approx(1.3)


def test_a_step_within_the_band_is_as_predicted_and_compute_drift_is_named_as_compute():
    ok = [_record(s, 1.03, 0.5, PRED) for s in range(1, 8)]
    assert observed.prediction_check(ok)["message"].endswith(": as predicted")
    slow_bwd = [
        {**_record(s, 1.2, 0.52, PRED), "phases": {"forward": 0.2, "backward": 1.0, "update_busy": 0.52}}
        for s in range(1, 8)
    ]
    assert observed.prediction_check(slow_bwd)["message"].endswith(
        "the backward differs most from its prediction"
    )


def test_no_check_without_a_prediction_or_enough_steady_steps():
    assert observed.prediction_check([_record(s, 1.0, 0.5, PRED) for s in range(1, 5)]) is None  # 2 steady
    assert observed.prediction_check([_record(s, 1.0, 0.5, {}) for s in range(1, 10)]) is None
    no_busy = {k: v for k, v in PRED.items() if k != "update_busy"}
    check = observed.prediction_check([_record(s, 1.0, 0.5, no_busy) for s in range(1, 10)])
    assert check["host_update"] is None and observed.host_observation(check) is None


def test_the_observation_is_the_busy_ratio_and_broken_or_short_ones_are_not_kept():
    records = [_record(s, 1.1, 0.55, PRED) for s in range(1, 8)]
    assert observed.host_observation(observed.prediction_check(records)) == pytest.approx(1.1)
    broken = [_record(s, 1.1, 5.0, PRED) for s in range(1, 8)]  # 10x: a measure gone wrong, not a host
    assert observed.host_observation(observed.prediction_check(broken)) is None
    short = [_record(s, 1.1, 0.55, PRED) for s in range(1, 7)]  # 4 steady steps: checked, too few to keep
    assert observed.prediction_check(short) is not None
    assert observed.host_observation(observed.prediction_check(short)) is None


def test_the_factor_is_kept_with_the_calibration_it_was_planned_with_and_only_then(tmp_path):
    cal, _, _ = _measured()
    path = tmp_path / "host-key.json"
    path.write_text(json.dumps(cal))
    digest = calibration_digest(cal)
    for f in (1.3, 1.1, 1.4, 1.2, 1.25, 1.35):  # observations leave the calibration's digest as it was
        assert observed.record_observation(str(path), digest, True, f, 7)
    kept = json.loads(path.read_text())
    assert [r["factor"] for r in kept["observed_host"]["clipped"]] == [1.1, 1.4, 1.2, 1.25, 1.35]  # the last 5
    assert "unclipped" not in kept["observed_host"]
    # a plan priced with another calibration (this shape measured again since): nothing written
    before = path.read_text()
    assert not observed.record_observation(str(path), "0" * 16, True, 1.9, 7)
    assert not observed.record_observation(str(tmp_path / "gone.json"), digest, True, 1.9, 7)
    assert path.read_text() == before


def test_observations_price_nothing_and_leave_a_stored_plan_standing():
    # charged to the host update of later plans, on a live pair the plan moved and its updater was again under its
    # charge: kept for reading, not for pricing, so a job run twice keeps its plan
    cal, topo, cfg = _measured()
    seen = copy.deepcopy(cal)
    seen["observed_host"] = {"clipped": [{"factor": 1.3, "steps": 8, "at": "x"}]}
    job = Job.from_config(cfg, topo)
    assert Rates(seen, job).update_s(10_000_000, "host") == Rates(cal, job).update_s(10_000_000, "host")
    before, after = plan_job(cfg, topo, cal), plan_job(cfg, topo, seen)
    assert after["predicted"] == before["predicted"] and after["policy"] == before["policy"]
    assert plan_basis(cfg, topo, seen) == plan_basis(cfg, topo, cal)
    bare = {k: v for k, v in cal.items() if k != "created_at"}  # a record without a header is its whole content
    assert calibration_digest({**bare, "observed_host": seen["observed_host"]}) == calibration_digest(bare)
    pred = metrics_prediction(after)
    assert pred["update_busy"] == pytest.approx(after["predicted"]["busy"]["cpu"]) and "host_factor" not in pred
    assert "measured beside the issuing thread)" in format_plan(after)


def test_the_launcher_keeps_a_gpu_runs_factor_in_the_calibration_it_planned_with(tmp_path, monkeypatch):
    cal, topo, cfg = _measured()
    monkeypatch.setattr(calib, "cache_dir", lambda: str(tmp_path))
    path = calib.cache_path(cfg, topo)
    with open(path, "w") as fh:
        json.dump(cal, fh)
    detected: Future = Future()
    detected.set_result(topo)
    plan = {"basis": plan_basis(cfg, topo, cal)}
    records = [_record(s, 1.16, 0.65, PRED) for s in range(1, 10)]
    lines: list[str] = []
    check = observed.check_run(cfg, plan, detected, records, lines.append)
    assert check["host_update"]["ratio"] == pytest.approx(1.3)
    with open(path) as fh:
        assert [r["factor"] for r in json.load(fh)["observed_host"]["clipped"]] == [pytest.approx(1.3)]
    assert lines[0].startswith("prediction: steps 3-9") and "kept with this host's calibration" in lines[1]
    # the same plan again: the observation did not change its basis, so the second run's factor is added too
    lines.clear()
    observed.check_run(cfg, plan, detected, records, lines.append)
    with open(path) as fh:
        assert len(json.load(fh)["observed_host"]["clipped"]) == 2
    # a plan priced with another calibration (recalibrated since): nothing added
    lines.clear()
    observed.check_run(cfg, {"basis": {"calibration": "0" * 16}}, detected, records, lines.append)
    with open(path) as fh:
        assert len(json.load(fh)["observed_host"]["clipped"]) == 2
    assert len(lines) == 1
    # records the check cannot read cost the check, not the run
    lines.clear()
    assert observed.check_run(cfg, plan, detected, [{"step_time_s": 1.0, "predicted": {"step_time_s": 1.0}}] * 5,
                                    lines.append) is None
    assert lines[0].startswith("prediction: not checked (KeyError")
    # a CPU job observes nothing into any calibration
    cpu = _measured(gpus=0, gpu_memory_gib=None)[2]
    assert (
        observed.check_run(cpu, {"basis": plan_basis(cpu, topo, cal)}, detected, records, None)
        is not None
    )


def test_a_planned_cpu_run_checks_its_prediction_and_the_cli_prints_the_error(tmp_path, capsys):
    from slidedp import cli

    from tests.runtime.exactness import make_token_data

    data = make_token_data(str(tmp_path / "data.jsonl"), rows=8, seq_len=32, seed=3)
    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32, "micro_batch_size": 2,
           "steps": 6, "ranks": 1, "precision": "fp32", "output_dir": str(tmp_path / "out"), "cpu_threads": 1,
           "export": False}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    assert cli.main(["train", "--config", str(path), "--progress", "lines"]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert isinstance(summary["prediction_error"], float)
    assert "prediction: steps 3-6: median step" in out.out + out.err
