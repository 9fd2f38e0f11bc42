"""A run's steady steps against its prediction, and the host factor a GPU run observes, kept with the calibration
its plan was priced with and charged by later plans of it (slidedp.planning.observed)."""

from __future__ import annotations

import copy
import json
import os
from concurrent.futures import Future

import pytest
from slidedp import launch
from slidedp.config import JobConfig
from slidedp.planning import calibration as calib
from slidedp.planning import observed
from slidedp.planning.autopolicy import plan_job
from slidedp.planning.basis import calibration_digest, plan_basis
from slidedp.planning.cost_model import Rates, predict
from slidedp.planning.job import Job
from slidedp.planning.plan_json import metrics_prediction
from slidedp.planning.report import format_plan
from slidedp.policy import ExecutionPolicy

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
    assert check["host_factor"] == 1.0
    assert check["prediction_error"] == pytest.approx(1 / 1.17 - 1)
    assert "median step 1.170 s, predicted 1.000 s (-14.5%)" in check["message"]
    assert check["message"].endswith("the host update ran 1.30x the time the plan charged (this host's memory "
                                     "slower now than when it was calibrated)")
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


def test_the_observation_is_against_the_calibrations_own_seconds_and_broken_ones_are_not_kept():
    # a plan that already charged the host 1.2x, and a run whose updater was busy 1.1x that: 1.32x the calibration
    records = [_record(s, 1.1, 0.55, {**PRED, "host_factor": 1.2}) for s in range(1, 8)]
    assert observed.host_observation(observed.prediction_check(records)) == pytest.approx(1.32)
    broken = [_record(s, 1.1, 5.0, PRED) for s in range(1, 8)]  # 10x: a measure gone wrong, not a host
    assert observed.host_observation(observed.prediction_check(broken)) is None
    short = [_record(s, 1.1, 0.55, PRED) for s in range(1, 7)]  # 4 steady steps: checked, too few to keep
    assert observed.prediction_check(short) is not None and observed.host_observation(observed.prediction_check(short)) is None


def test_the_factor_is_kept_with_the_calibration_it_was_planned_with_and_only_then(tmp_path):
    cal, _, _ = _measured()
    path = tmp_path / "host-key.json"
    path.write_text(json.dumps(cal))
    digest = calibration_digest(cal)
    for f in (1.3, 1.1, 1.4, 1.2, 1.25, 1.35):
        now = digest if f == 1.3 else calibration_digest(json.loads(path.read_text()))
        assert observed.record_observation(str(path), now, True, f, 7)
    kept = json.loads(path.read_text())
    assert [r["factor"] for r in kept["observed_host"]["clipped"]] == [1.1, 1.4, 1.2, 1.25, 1.35]  # the last 5
    assert observed.observed_factor(kept, clip=True) == pytest.approx(1.25)
    assert observed.observed_factor(kept, clip=False) == 1.0 and observed.observations(kept, False) == 0
    # a plan priced with the calibration before these observations (or another one): nothing written
    before = path.read_text()
    assert not observed.record_observation(str(path), digest, True, 1.9, 7)
    assert not observed.record_observation(str(tmp_path / "gone.json"), digest, True, 1.9, 7)
    assert path.read_text() == before


def test_rates_charge_the_observed_factor_to_the_host_update_on_gpus_for_the_jobs_clipping_only():
    cal, topo, cfg = _measured()
    seen = copy.deepcopy(cal)
    seen["observed_host"] = {"clipped": [{"factor": 1.3, "steps": 8, "at": "x"}]}
    job = Job.from_config(cfg, topo)
    base, more = Rates(cal, job), Rates(seen, job)
    assert more.update_s(10_000_000, "host") == pytest.approx(base.update_s(10_000_000, "host") * 1.3)
    # the busy time it comes from already holds what sharing host memory cost the updater: not charged twice
    assert more.copy_s(4e9) == base.copy_s(4e9) and more.pools() == base.pools()
    summary = more.host_update_summary("host")
    assert summary["observed_factor"] == 1.3 and summary["observed_runs"] == 1
    assert summary["cpu_s_per_1e9"] == pytest.approx(base.host_update_summary("host")["cpu_s_per_1e9"])
    job0 = Job.from_config(_measured(optimizer={"max_grad_norm": 0.0})[2], topo)
    assert Rates(seen, job0).update_s(10_000_000, "host") == pytest.approx(
        Rates(cal, job0).update_s(10_000_000, "host")
    )


def test_a_plan_of_an_observed_calibration_is_priced_slower_says_so_and_its_records_carry_it():
    cal, topo, cfg = _measured()
    seen = copy.deepcopy(cal)
    seen["observed_host"] = {"clipped": [{"factor": 1.3, "steps": 8, "at": "x"}]}
    before, after = plan_job(cfg, topo, cal), plan_job(cfg, topo, seen)
    assert after["host_update"]["observed_factor"] == 1.3 and before["host_update"]["observed_factor"] == 1.0
    # `slidedp plan` says where the charge comes from
    assert "measured beside the issuing thread x 1.30 as 1 run on this host measured it)" in format_plan(after)
    assert "measured beside the issuing thread)" in format_plan(before)
    # the plan made before, priced with the observation: its host update is charged 1.3x and its step is longer
    job, chosen = Job.from_config(cfg, topo), ExecutionPolicy.from_dict(before["policy"])
    was, now = predict(job, chosen, Rates(cal, job)), predict(job, chosen, Rates(seen, job))
    assert now["busy"]["cpu"] > was["busy"]["cpu"] and now["step_time_s"] > was["step_time_s"]
    assert was["step_time_s"] == pytest.approx(before["predicted"]["step_time_s"])
    assert after["policy"] != before["policy"]  # and the search, made again, chose otherwise
    pred = metrics_prediction(after)
    assert pred["host_factor"] == 1.3 and pred["update_busy"] == pytest.approx(
        after["predicted"]["busy"]["cpu"]
    )
    # a stored plan of the calibration before the observation is stale; a calibration never observed keeps its basis
    assert plan_basis(cfg, topo, seen)["calibration"] != plan_basis(cfg, topo, cal)["calibration"]
    assert calibration_digest(cal) == calibration_digest(json.loads(json.dumps(cal)))


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
    check = launch._check_prediction(cfg, plan, detected, records, lines.append)
    assert check["host_update"]["ratio"] == pytest.approx(1.3)
    with open(path) as fh:
        assert observed.observed_factor(json.load(fh), clip=True) == pytest.approx(1.3)
    assert lines[0].startswith("prediction: steps 3-9") and "kept with this host's calibration" in lines[1]
    # the same plan again: its calibration has changed since, so the second run's factor is not added to it
    lines.clear()
    launch._check_prediction(cfg, plan, detected, records, lines.append)
    with open(path) as fh:
        assert observed.observations(json.load(fh), True) == 1
    assert len(lines) == 1
    # a CPU job observes nothing into any calibration
    cpu = _measured(gpus=0, gpu_memory_gib=None)[2]
    assert (
        launch._check_prediction(cpu, {"basis": plan_basis(cpu, topo, cal)}, detected, records, None)
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
