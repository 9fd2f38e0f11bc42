"""The plan's `clipping` (planning/clip_cost.py): what exact clipping costs the chosen plan, who updates what, and
where the gradients wait, checked against the same job planned and priced with max_grad_norm 0 by the public
entry points (Job.from_config of the unclipped config, the cost and memory models), and shown by `slidedp plan`."""

from __future__ import annotations

import dataclasses
import json

import pytest
from slidedp import cli
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import profiles
from slidedp.planning.cost_model import Rates, predict
from slidedp.planning.job import Job
from slidedp.planning.memory_model import ALLOCATOR_SLACK, ActivationSizes, memory
from slidedp.planning.plan import Plan
from slidedp.planning.report import format_plan
from slidedp.policy import ExecutionPolicy

PROFILE = "1x-l40s-256g"  # a declared host: one 48 GB card, its calibration derived for any shape


def _cfg(max_grad_norm: float, **policy) -> JobConfig:
    return JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 2,
                                "seq_len": 2048, "optimizer": {"max_grad_norm": max_grad_norm}, "policy": policy})


def _plan(cfg: JobConfig, calibrated: bool = True) -> tuple[Plan, dict, dict]:
    prof = profiles.load(PROFILE)
    topo = profiles.declared_topology(prof)
    cal = profiles.declared_calibration(cfg, prof)
    return ap.plan_for(cfg, topo, cal if calibrated else None), topo, cal


def _unclipped_step(policy: dict, topo: dict, cal: dict) -> tuple[float, bool]:
    """The chosen policy (its streamed layers back on the host) priced for the job with max_grad_norm 0, built
    from the unclipped config; and whether it fits there."""
    cfg0 = _cfg(0.0)
    pol = ExecutionPolicy.from_dict({**policy, "streamed_layers": 0})
    job0 = Job.from_config(dataclasses.replace(cfg0, policy=dataclasses.replace(
        cfg0.policy, delivery_cast=pol.delivery_cast)), topo)
    assert not job0.clip
    m = memory(job0, pol, ActivationSizes.of(job0, cal))
    fits = m["hbm_peak_bytes"] <= job0.hbm_budget and m["host_bytes"] <= job0.host_limit_bytes
    return predict(job0, pol, Rates(cal, job0))["step_time_s"], fits


def test_a_clipped_plan_with_streamed_layers_says_what_clipping_costs_and_where_gradients_wait():
    plan, topo, cal = _plan(_cfg(1.0, streamed_layers=12))
    assert plan.feasible, plan.errors
    c, pol, pred = plan.clipping, plan.policy, plan.predicted
    assert c is not None and c.max_grad_norm == 1.0
    assert pol["streamed_layers"] == 12
    # the time: the plan's own step, against the same policy priced without clipping (streamed layers on the host)
    assert c.step_time_s == plan.step_time_s
    unclipped, fits = _unclipped_step(pol, topo, cal)
    assert c.unclipped_step_time_s == pytest.approx(unclipped, rel=1e-12)
    assert c.unclipped_change == {"streamed_layers": 0} and c.unclipped_fits is fits is True
    assert c.cost_s == pytest.approx(plan.step_time_s - unclipped, rel=1e-12)
    assert c.cost_s > 0 and c.cost_fraction == pytest.approx(c.cost_s / unclipped, rel=1e-12)
    # the split: every layer and every parameter is updated by exactly one of them
    assert (c.layers, c.device_layers, c.streamed_layers) == (36, pol["device_layers"], 12)
    assert c.host_layers == 36 - pol["device_layers"] - 12 and c.edge_update == pol["edge_update"]
    assert c.host_params + c.device_params + c.streamed_params == plan.job.params
    assert c.streamed_params > 0 and c.host_params > c.streamed_params
    # where gradients wait: the memory model's terms of the same plan (HBM parts carry the allocator's slack)
    assert c.held_gradient_gib == pytest.approx(pred.host_parts_gib["held_gradient"], rel=1e-12)
    assert c.held_bf16_gib == pytest.approx(c.held_gradient_gib)  # one rank, bf16, no accumulation: layers in bf16
    assert c.gpu_waiting_gib * (1 + ALLOCATOR_SLACK) == pytest.approx(pred.hbm_parts_gib["streamed_gradients"])
    assert c.gpu_waiting_bf16 is True
    assert c.gpu_waiting_gib * 2**30 == pytest.approx(c.streamed_params * 2, rel=1e-6)  # bf16, one rank
    # the section travels in the plan JSON and is read back as it was written
    d = plan.to_dict()
    assert d["clipping"]["unclipped_change"] == {"streamed_layers": 0}
    assert Plan.from_dict(json.loads(json.dumps(d))).to_dict() == json.loads(json.dumps(d))


def test_a_clipped_plan_the_planner_leaves_alone_is_priced_unclipped_unchanged():
    plan, topo, cal = _plan(_cfg(1.0))
    assert plan.feasible, plan.errors
    c = plan.clipping
    unclipped, fits = _unclipped_step(plan.policy, topo, cal)
    assert plan.policy["streamed_layers"] == 0 and c.unclipped_change == {}  # nothing to change: the same policy
    assert c.unclipped_step_time_s == pytest.approx(unclipped, rel=1e-12) and c.unclipped_fits is fits
    assert c.step_time_s - c.unclipped_step_time_s == pytest.approx(c.cost_s)
    assert c.gpu_waiting_gib == 0.0 and c.held_gradient_gib == pytest.approx(
        plan.predicted.host_parts_gib["held_gradient"], rel=1e-12)
    # the job planned without clipping has no section, and holds no gradient for a norm
    off, _, _ = _plan(_cfg(0.0))
    assert off.feasible and off.clipping is None and "clipping" not in off.to_dict()
    assert off.predicted.host_parts_gib["held_gradient"] == 0


def test_without_a_calibration_the_section_has_the_split_and_no_times():
    plan, _, _ = _plan(_cfg(1.0, streamed_layers=12), calibrated=False)
    assert plan.feasible, plan.errors
    c = plan.clipping
    assert (c.step_time_s, c.unclipped_step_time_s, c.cost_s, c.cost_fraction) == (None, None, None, None)
    assert c.streamed_layers == 12 and c.host_layers + c.device_layers + 12 == 36
    assert "is not timed" in format_plan(plan)


def test_slidedp_plan_prints_what_clipping_costs(tmp_path, capsys):
    job = tmp_path / "job.json"
    base = {"model": "qwen3-8b", "seq_len": 2048, "micro_batch_size": 2, "gpus": 1, "data": cli.FLAG_JOB_DATA,
            "policy": {"streamed_layers": 12}}
    job.write_text(json.dumps(base))  # max_grad_norm at its default, 1.0
    assert cli.main(["plan", "--config", str(job), "--profile", PROFILE]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("Clipping at 1.0 costs +"))
    plan, _, _ = _plan(_cfg(1.0, streamed_layers=12))
    c = plan.clipping
    assert f"+{c.cost_s:.3f} s (+{c.cost_fraction:.0%}) a step" in line
    assert f"against {c.unclipped_step_time_s:.3f} s for this policy unclipped with streamed_layers 0" in line
    assert f"the host updates {c.host_layers} of 36 layers" in line
    assert "12 stream through the GPUs after the norm" in line
    assert f"gradients wait: {c.held_gradient_gib:.1f} GiB in host memory (bf16), {c.gpu_waiting_gib:.1f} GiB on " \
           "each GPU (bf16)." in line
    job.write_text(json.dumps({**base, "policy": {}, "optimizer": {"max_grad_norm": 0}}))
    assert cli.main(["plan", "--config", str(job), "--profile", PROFILE]) == 0
    assert "Clipping at" not in capsys.readouterr().out
