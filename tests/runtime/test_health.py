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


def _demo_cfg(tmp_path, lr: float) -> dict:
    """The shipped CPU demo job (slidedp/assets/demo/job.yaml) for 16 steps at this learning rate."""
    import slidedp
    import yaml

    with open(os.path.join(os.path.dirname(slidedp.__file__), "assets", "demo", "job.yaml"), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    cfg.update(output_dir=str(tmp_path / "out"), steps=16, optimizer={**cfg["optimizer"], "lr": lr})
    cfg["checkpoint"] = {"interval": 0}
    return cfg


def _records(*rows) -> list[dict]:
    return [{"step": i + 1, "loss": loss, "grad_norm": norm} for i, (loss, norm) in enumerate(rows)]


def _monitor(**health) -> HealthMonitor:
    return HealthMonitor(JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "steps": 100,
                                              "schedule": {"warmup_steps": 6}, "health": health}))


def test_the_monitor_names_non_finite_numbers_as_divergence():
    mon = _monitor()
    assert mon.check({"step": 1, "loss": 5.0, "grad_norm": 1.0}) == (None, [])
    reason, _ = mon.check({"step": 2, "loss": math.nan, "grad_norm": 1.0})
    assert reason == "diverged: loss is NaN at step 2" == mon.stop_reason and mon.diverged_step == 2
    assert _monitor().check({"step": 3, "loss": 1.0, "grad_norm": math.inf})[0] == (
        "diverged: gradient norm is +inf at step 3")


def test_a_dead_gradient_inside_the_warmup_fails_the_run_at_the_step_it_died():
    """The run users reported: the demo at lr 1000 with 6 warm-up steps. Loss 6.26, a spike to 2.2 million at step 3
    (inside the warm-up), then the loss flat at 6.238 with a gradient norm of exactly 0: dead at step 4, said at
    step 6, where three zero norms in a row are seen."""
    mon = _monitor()
    out = [mon.check(r) for r in _records((6.26, 2.0), (6.1, 3.0), (2.2e6, 9e9), (6.238, 0.0), (6.238, 0.0),
                                          (6.238, 0.0))]
    assert out[0] == (None, []) and out[1] == (None, [])
    assert [w["kind"] for w in out[2][1]] == ["loss_spike"] and "above 10x" in out[2][1][0]["message"]
    assert out[3] == (None, []) and out[4] == (None, [])  # the spike came back; two zeros are not yet dead
    reason, raised = out[5]
    assert [w["kind"] for w in raised] == ["zero_grad"]
    assert reason == ("diverged: the gradient norm is exactly 0 for 3 steps in a row (steps 4-6), so nothing is "
                      "learning, at step 4") == mon.stop_reason
    assert mon.diverged_step == 4


def test_a_spike_that_does_not_come_back_is_dead_and_one_that_does_is_a_warning():
    mon = _monitor(spike_recovery_steps=3)
    rows = _records((4.0, 1.0), (3.0, 1.0), (80.0, 5.0), (60.0, 5.0), (45.0, 5.0), (31.0, 5.0))
    out = [mon.check(r) for r in rows]
    assert [len(w) for _, w in out] == [0, 0, 1, 1, 1, 1]  # each step above 10 x 3.0 warns
    assert [r for r, _ in out[:5]] == [None] * 5
    assert out[5][0] == ("diverged: the loss jumped to 80 (above 10x the lowest loss before it, 3) and stayed "
                         "above 30 for 3 steps, at step 3") and mon.diverged_step == 3
    back = _monitor(spike_recovery_steps=3)
    rows = _records((4.0, 1.0), (3.0, 1.0), (80.0, 5.0), (60.0, 5.0), (29.0, 5.0), (31.0, 5.0), (32.0, 5.0))
    assert [back.check(r)[0] for r in rows] == [None] * 7  # back under 30 at step 5; step 6's spike is a new one
    assert back.stop_reason is None and [w["step"] for w in back.warnings] == [3, 4, 6, 7]
    assert back.suspect  # a spike not yet back: checkpoints written now may hold a dead state


def test_on_dead_warn_keeps_a_dead_run_going_with_its_warnings():
    mon = _monitor(on_dead="warn", zero_grad_steps=2)
    out = [mon.check(r) for r in _records((6.9, 2.0), (6.8, 0.0), (6.8, 0.0), (6.8, 0.0))]
    assert [r for r, _ in out] == [None] * 4 and mon.stop_reason is None
    assert [w["kind"] for w in mon.warnings] == ["zero_grad"]


def test_spikes_inside_the_warmup_are_warned_and_stop_mode_names_the_warning():
    mon = _monitor(on_warning="stop")
    assert mon.check({"step": 1, "loss": 1.0, "grad_norm": 1.0}) == (None, [])
    assert mon.check({"step": 2, "loss": 11.0, "grad_norm": 1.0})[1][0]["kind"] == "loss_spike"
    assert mon.stop_reason.startswith("stopped by health.on_warning: loss 11 at step 2")


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
def test_the_cpu_demo_at_lr_1000_ends_failed_at_the_step_it_died(tmp_path):
    """The run users reported: the shipped CPU demo job (6 warm-up steps) at lr 1000. Its loss spikes inside the
    warm-up and then its gradient norm is exactly 0: the run fails naming the step it died at, instead of
    completing with warnings; nothing is exported."""
    cfg = _demo_cfg(tmp_path, lr=1000.0)
    with pytest.raises(UnhealthyRun, match=r"^diverged: .* at step \d+$") as err:
        train(cfg)
    with open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) < 16, [(r["step"], r["loss"], r["grad_norm"]) for r in rows]  # it stopped early
    said = [r for r in rows if r.get("diverged")]
    assert said and said[0]["diverged"] == str(err.value) and 1 <= err.value.step <= said[0]["step"]
    assert not (tmp_path / "out" / "final").exists()


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



@pytest.mark.slow
def test_checkpoints_from_before_the_run_died_are_not_rotated_away(tmp_path):
    """The demo at lr 1000 with a checkpoint every step and keep 1: once the loss spikes the run is suspect, so the
    checkpoints written until it is said dead do not rotate away the one from before it died."""
    cfg = _demo_cfg(tmp_path, lr=1000.0)
    cfg["checkpoint"] = {"interval": 1, "keep": 1}
    with pytest.raises(UnhealthyRun) as err:
        train(cfg)
    kept = sorted(int(name.split("-")[1]) for name in os.listdir(tmp_path / "out" / "checkpoints"))
    assert kept and kept[0] < err.value.step, (kept, str(err.value))


def test_the_monitor_s_edges_and_words():
    """What mutation testing found untested: a negative infinity is named as one; a loss exactly on the spike line
    is no spike and one exactly back on it has come back; a dead gradient's warning names its last step."""
    assert _monitor().check({"step": 4, "loss": 1.0, "grad_norm": -math.inf})[0] == (
        "diverged: gradient norm is -inf at step 4")
    mon = _monitor()
    mon.check({"step": 1, "loss": 2.0, "grad_norm": 1.0})
    assert mon.check({"step": 2, "loss": 20.0, "grad_norm": 1.0}) == (None, [])  # on the line (10 x 2.0)
    assert mon.check({"step": 3, "loss": 20.5, "grad_norm": 1.0})[1][0]["kind"] == "loss_spike" and mon.suspect
    mon.check({"step": 4, "loss": 20.0, "grad_norm": 1.0})
    assert not mon.suspect  # back on the line is back
    dead = _monitor(on_dead="warn", zero_grad_steps=2)
    dead.check({"step": 7, "loss": 1.0, "grad_norm": 0.0})
    _, [warning] = dead.check({"step": 8, "loss": 1.0, "grad_norm": 0.0})
    assert warning == {"step": 8, "kind": "zero_grad",
                       "message": "gradient norm is exactly 0 for 2 steps in a row (steps 7-8): nothing is learning"}
