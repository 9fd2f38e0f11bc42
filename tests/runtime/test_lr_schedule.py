"""The learning-rate schedule, judged on the weights against torch.

slidedp.train() on the CPU (1 rank, fp32) with `schedule` warmup + cosine (to 0 and to a floor), warmup +
linear to a floor, and warmup + constant must end where torch.optim.AdamW under
torch.optim.lr_scheduler.LambdaLR ends from the same initial weights over the same batches: the weight change
w6 - w0 and both AdamW moments to 1e-4 relative per tensor (the exactness suite's tolerance), every step's
loss to 1e-5 and every reported lr to 1e-12. The LambdaLR multiplier is written here from docs/interfaces.md
§1 (`schedule.*`), not taken from the runtime. A run stopped after step 3 and resumed to step 6 must end at
the same weights as the uninterrupted torch run.
"""

from __future__ import annotations

import math
import os

import pytest
import slidedp
import torch
from safetensors.torch import load_file
from slidedp.config import OptimizerConfig, ScheduleConfig
from slidedp.step.optimizer import lr_at

from tests.runtime.exactness import make_model_dir, make_token_data, reference_run, rel_err, slidedp_tensors

STEPS, SEQ, MBS = 6, 24, 2
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-6, 0.1


def documented_multiplier(i: int, steps: int, warmup: int, decay: str, floor: float) -> float:
    """LambdaLR's multiplier for its i-th optimizer step (i = 0, 1, ...: the number of scheduler.step() calls
    before it), from docs/interfaces.md §1: linear warmup from 0 to lr over `warmup` steps, then constant, or a
    linear / cosine decay to `floor` × lr.

    The convention pinned here: optimizer step k = i + 1 (1-based, as the runtime counts steps) trains at
    lr × k / warmup while k <= warmup, so the warmup's 0 is the step-0 point no step trains at: step 1 takes
    lr / warmup and step `warmup` the full lr (not LambdaLR's usual i / warmup, which spends step 1 at lr 0).
    After the warmup the decay's progress is (k - warmup) / (steps - warmup): the first decayed step is already
    one step down, and the last step (k = steps) trains at exactly floor × lr.
    """
    k = i + 1
    if warmup and k <= warmup:
        return k / warmup
    if decay == "constant":
        return 1.0
    progress = (k - warmup) / (steps - warmup)
    if decay == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    # cosine from 1 (progress 0) to the floor (progress 1), written as a squared cosine of the half angle
    return floor + (1.0 - floor) * math.cos(0.5 * math.pi * progress) ** 2


SCHEDULES = {
    "warmup2-cosine": {"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.0},
    "warmup2-cosine-floor": {"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.2},
    "warmup2-linear-floor": {"warmup_steps": 2, "decay": "linear", "min_lr_ratio": 0.25},
    "warmup3-constant": {"warmup_steps": 3, "decay": "constant", "min_lr_ratio": 0.0},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lr")
    return {
        "model": make_model_dir(str(root / "model"), "tiny-qwen3", seed=2),
        "data": make_token_data(str(root / "data.jsonl"), rows=MBS * STEPS, seq_len=SEQ, seed=5),
        "root": root,
    }


def _config(workdir, schedule: dict, out: str, **over) -> dict:
    cfg = {
        "model": workdir["model"],
        "data": {"path": workdir["data"], "format": "tokens", "shuffle": False},
        "seq_len": SEQ, "micro_batch_size": MBS, "steps": STEPS, "ranks": 1, "gpus": 0,
        "precision": "fp32", "output_dir": out, "export": False, "cpu_threads": 1,
        "optimizer": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD, "max_grad_norm": 0.0},
        "schedule": schedule,
        "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint"},
        "checkpoint": {"interval": STEPS, "keep": 1},
    }
    cfg.update(over)
    return cfg


def _torch_reference(workdir, schedule: dict) -> dict:
    def multiplier(i: int) -> float:
        return documented_multiplier(i, STEPS, schedule["warmup_steps"], schedule["decay"], schedule["min_lr_ratio"])

    return reference_run(workdir["model"], workdir["data"], STEPS, MBS, LR, BETAS, EPS, WD, 0.0,
                         lr_lambda=multiplier)


def _assert_matches(workdir, out: str, metrics: list[dict], ref: dict) -> None:
    # the weights first: they are what the schedule is for (the reported lr is checked last)
    ours = slidedp_tensors(os.path.join(out, "checkpoints", f"step-{STEPS:08d}"), workdir["model"])
    w0 = load_file(os.path.join(workdir["model"], "model.safetensors"))
    for name, delta in ref["delta"].items():
        err = rel_err(ours["master"][name] - w0[name], delta)
        assert err <= 1e-4, (name, err)
        for kind in ("exp_avg", "exp_avg_sq"):
            err = rel_err(ours[kind][name], ref[kind][name])
            assert err <= 1e-4, (kind, name, err)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m, lr, loss in zip(metrics, ref["lrs"], ref["losses"]):
        assert abs(m["loss"] - loss) <= 1e-5 * abs(loss), (m["step"], m["loss"], loss)
        assert m["lr"] == pytest.approx(lr, rel=1e-12, abs=1e-15), (m["step"], m["lr"], lr)


# make test-fast keeps its 10 minutes with the warm-up into a constant rate; make test runs every schedule
@pytest.mark.parametrize("name", [n if n == "warmup3-constant" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SCHEDULES])
def test_schedule_trains_to_the_weights_of_torch_adamw_under_lambdalr(workdir, name):
    schedule = SCHEDULES[name]
    ref = _torch_reference(workdir, schedule)
    # the multiplier has the documented shape, in numbers (so that a wrong lambda cannot agree with a runtime
    # that is wrong the same way): steps 1..6 of a 6-step run
    expected = {
        # lr/2, lr, then (1 + cos(pi q/4)) / 2 for q = 1, 2, 3, 4
        "warmup2-cosine": [0.5, 1.0, 0.8535533905932737, 0.5, 0.14644660940672624, 0.0],
        # 0.2 + 0.8 (1 + cos(pi q/4)) / 2 for q = 1, 2, 3, 4
        "warmup2-cosine-floor": [0.5, 1.0, 0.882842712474619, 0.6, 0.317157287525381, 0.2],
        # 0.25 + 0.75 (1 - q/4) for q = 1, 2, 3, 4
        "warmup2-linear-floor": [0.5, 1.0, 0.8125, 0.625, 0.4375, 0.25],
        "warmup3-constant": [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0],
    }[name]
    expected = [LR * f for f in expected]
    assert ref["lrs"] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    out = str(workdir["root"] / f"run-{name}")
    result = slidedp.train(_config(workdir, schedule, out))
    assert result.status == "completed" and result.steps_done == STEPS
    _assert_matches(workdir, out, result.metrics, ref)


def _torch_decay_lrs(decay: str, lr: float, span: int, floor: float) -> list[float]:
    """torch's own decay schedulers over `span` steps down to floor × lr: the lr after 1, 2, ..., span steps."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    if decay == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=span, eta_min=floor * lr)
    else:
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=floor, total_iters=span)
    out = []
    for _ in range(span):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("warmup, floor", [(0, 0.1), (3, 0.25), (4, 0.0), (12, 0.3)])  # 12: one decayed step
def test_the_decay_reaches_its_floor_as_torch_schedulers_do(decay, warmup, floor):
    """lr_at itself, against CosineAnnealingLR (eta_min = floor × lr) and LinearLR (end_factor = floor): a floor
    above 0 lifts every decayed step, not only the last (the trained runs above use floor 0 for the cosine).
    Past the last step the lr stays at the floor."""
    total, lr = 13, 2e-3
    opt, sched = OptimizerConfig(lr=lr), ScheduleConfig(warmup_steps=warmup, decay=decay, min_lr_ratio=floor)
    ours = [lr_at(k, total, opt, sched) for k in range(1, total + 1)]
    assert ours[:warmup] == pytest.approx([lr * k / warmup for k in range(1, warmup + 1)], rel=1e-12)
    assert ours[warmup:] == pytest.approx(_torch_decay_lrs(decay, lr, total - warmup, floor), rel=1e-9, abs=1e-15)
    assert ours[-1] == pytest.approx(floor * lr, rel=1e-12, abs=1e-18)
    assert lr_at(total + 5, total, opt, sched) == pytest.approx(floor * lr, rel=1e-12, abs=1e-18)
    # in numbers, from the formula written here (docs/interfaces.md §1), so torch and the runtime cannot agree on
    # a wrong floor: the middle decayed step of each
    mid = warmup + (total - warmup) // 2
    q = (mid - warmup) / (total - warmup)
    shape = 0.5 * (1 + math.cos(math.pi * q)) if decay == "cosine" else 1 - q
    assert lr_at(mid, total, opt, sched) == pytest.approx(lr * (floor + (1 - floor) * shape), rel=1e-12)


def test_a_constant_schedule_ignores_the_floor():
    opt = OptimizerConfig(lr=1e-3)
    sched = ScheduleConfig(warmup_steps=2, decay="constant", min_lr_ratio=0.5)
    assert [lr_at(k, 6, opt, sched) for k in range(1, 8)] == pytest.approx([5e-4] + [1e-3] * 6, rel=1e-15)


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_a_stopped_and_resumed_schedule_ends_at_the_uninterrupted_torch_weights(workdir):
    """Stopped once step 3 is reported (the interval checkpoint of step 3 is the one resumed), resumed to 6:
    the schedule continues from step 4 of the 6-step run, with AdamW's step count restored."""
    schedule = {"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1}
    ref = _torch_reference(workdir, schedule)
    out = str(workdir["root"] / "run-resumed")
    seen: list[int] = []
    first = slidedp.train(_config(workdir, schedule, out, checkpoint={"interval": 3, "keep": 2}),
                          on_step=lambda r: seen.append(r["step"]),
                          should_stop=lambda: bool(seen) and seen[-1] >= 3)
    assert first.status == "stopped" and first.steps_done == 3
    assert os.path.isdir(os.path.join(out, "checkpoints", "step-00000003"))
    second = slidedp.train(_config(workdir, schedule, out, checkpoint={"interval": 3, "keep": 2}, resume=True))
    assert second.status == "completed" and second.steps_done == STEPS
    assert [m["step"] for m in second.metrics] == [4, 5, 6]
    _assert_matches(workdir, out, first.metrics + second.metrics, ref)
