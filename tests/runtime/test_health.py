"""Run health (slidedp.health): a diverged run fails with its reason and writes nothing from the bad state; a
sick one raises warnings (or stops with on_warning: stop); a healthy one is untouched. Real CPU runs of the tiny
preset; the monitor's rules also checked on records alone."""

from __future__ import annotations

import json
import math
import os

import pytest
from slidedp.config import JobConfig
from slidedp.health import HealthMonitor, finite_json
from slidedp.launch import UnhealthyRun, train

from tests.runtime.exactness import make_pattern_data


def _cfg(tmp_path, **over) -> dict:
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=64, seq_len=32)
    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": 32,
           "micro_batch_size": 2, "steps": 6, "ranks": 1, "precision": "fp32", "output_dir": str(tmp_path / "out"),
           "optimizer": {"lr": 1e-3}, "export": True, "checkpoint": {"interval": 1, "keep": 2}}
    for key, value in over.items():
        if isinstance(value, dict):
            cfg[key] = {**cfg.get(key, {}), **value}
        else:
            cfg[key] = value
    return cfg


def _records(*rows) -> list[dict]:
    return [{"step": i + 1, "loss": loss, "grad_norm": norm} for i, (loss, norm) in enumerate(rows)]


def test_the_monitor_names_divergence_spikes_and_dead_gradients():
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "schedule": {"warmup_steps": 0}})
    mon = HealthMonitor(cfg)
    out = [mon.check(r) for r in _records((6.9, 2.0), (7.1e6, 9e9), (6.238, 0.0), (6.238, 0.0), (6.238, 0.0),
                                          (6.238, 0.0))]
    assert out[0] == (None, [])
    assert [w["kind"] for w in out[1][1]] == ["loss_spike"] and "above 10x" in out[1][1][0]["message"]
    assert out[2] == (None, []) and out[3] == (None, [])
    assert [w["kind"] for w in out[4][1]] == ["zero_grad"]  # the third zero in a row, once
    assert out[5] == (None, [])
    assert mon.stop_reason is None  # on_warning: warn
    mon = HealthMonitor(cfg)
    assert mon.check({"step": 1, "loss": 5.0, "grad_norm": 1.0}) == (None, [])
    reason, _ = mon.check({"step": 2, "loss": math.nan, "grad_norm": 1.0})
    assert reason == "diverged: loss is NaN at step 2" == mon.stop_reason and mon.diverged_step == 2
    assert HealthMonitor(cfg).check({"step": 3, "loss": 1.0, "grad_norm": math.inf})[0] == (
        "diverged: gradient norm is +inf at step 3")


def test_spikes_during_warmup_are_not_warned_and_stop_mode_names_the_warning():
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "steps": 10,
                               "schedule": {"warmup_steps": 3}, "health": {"on_warning": "stop"}})
    mon = HealthMonitor(cfg)
    for r in _records((1.0, 1.0), (50.0, 1.0), (60.0, 1.0)):
        assert mon.check(r) == (None, [])
    assert mon.check({"step": 4, "loss": 11.0, "grad_norm": 1.0})[1][0]["kind"] == "loss_spike"
    assert mon.stop_reason.startswith("stopped by health.on_warning: loss 11 at step 4")


def test_non_finite_numbers_are_written_as_null():
    assert finite_json({"loss": math.nan, "x": [1.0, math.inf], "d": {"y": -math.inf}}) == {
        "loss": None, "x": [1.0, None], "d": {"y": None}}


@pytest.mark.slow
@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_a_diverged_run_fails_and_keeps_the_last_good_checkpoint(tmp_path, clip):
    """lr 1e30: step 1 is finite, its update blows the weights up, step 2's loss is not finite. The run ends with
    the reason; the checkpoint of step 1 stays; nothing of step 2 or later, and no export."""
    cfg = _cfg(tmp_path, optimizer={"lr": 1e30, "max_grad_norm": clip})
    lines: list[str] = []
    with pytest.raises(UnhealthyRun, match=r"diverged: (loss|gradient norm) is (NaN|[+-]inf) at step 2") as err:
        train(cfg, on_log=lines.append)
    assert err.value.step == 2
    out = tmp_path / "out"
    assert sorted(os.listdir(out / "checkpoints")) == ["step-00000001"]
    assert not (out / "final").exists()
    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]  # valid JSON: the non-finite figures are null
    assert [r["step"] for r in rows] == [1, 2]  # the step after the bad one never ran
    assert rows[1]["diverged"].startswith("diverged:") and (rows[1]["loss"] is None or rows[1]["grad_norm"] is None)
    assert rows[1]["update_skipped"] is (clip > 0 and rows[1]["grad_norm"] is None)
    assert any("checkpoint" not in line and "diverged" in line for line in lines)


@pytest.mark.slow
def test_a_warned_run_completes_with_its_warnings_and_stop_mode_fails_it(tmp_path):
    cfg = _cfg(tmp_path, optimizer={"lr": 0.5}, health={"loss_spike_factor": 1.01}, steps=4)
    result = train(cfg)
    assert result.status == "completed" and result.warnings
    assert all(w["kind"] == "loss_spike" for w in result.warnings)
    with open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8") as fh:
        assert any(json.loads(line).get("warnings") for line in fh)
    stop = _cfg(tmp_path, optimizer={"lr": 0.5}, health={"loss_spike_factor": 1.01, "on_warning": "stop"}, steps=6,
                output_dir=str(tmp_path / "stop"))
    with pytest.raises(UnhealthyRun, match="stopped by health.on_warning"):
        train(stop)
    assert not (tmp_path / "stop" / "final").exists()


@pytest.mark.slow
def test_lr_1000_never_ends_as_a_plain_success(tmp_path):
    """The run users reported: lr 1000 in bf16 on the demo shape. It diverges (failed with the reason) or it
    completes with warnings; never a silent completion."""
    cfg = _cfg(tmp_path, optimizer={"lr": 1000.0}, precision="bf16", steps=8, checkpoint={"interval": 0})
    try:
        result = train(cfg)
    except UnhealthyRun as exc:
        assert str(exc).startswith("diverged:")
        return
    assert "loss_spike" in {w["kind"] for w in result.warnings}, [r["loss"] for r in result.metrics]


@pytest.mark.slow
def test_a_step_whose_only_bad_figure_is_its_gradient_norm_is_the_last_one_run(tmp_path):
    """The demo shape at lr 1e6 without warm-up: step 2's loss is finite but its gradient norm is not. No step
    runs after it (rank 0 reads the norm reduced on the device before the next step), nothing is exported."""
    cfg = {"model": "demo-qwen3", "data": {"path": "demo:demo_sft.jsonl", "format": "prompt_completion"},
           "seq_len": 128, "micro_batch_size": 8, "steps": 5, "precision": "fp32", "export": True,
           "output_dir": str(tmp_path / "out"), "optimizer": {"lr": 1e6}, "schedule": {"warmup_steps": 0}}
    with pytest.raises(UnhealthyRun) as err:
        train(cfg)
    step = err.value.step
    with open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert [r["step"] for r in rows] == list(range(1, step + 1)), (str(err.value), rows[-1])
    assert not (tmp_path / "out" / "final").exists()
