"""AutoPolicy keeps a safety margin of GPU memory: a plan leaving under 5% of the budget free (where the preview
warns that an error in the memory prediction could run the job out of memory) is not chosen when one at most 2%
slower keeps the margin; where none does, the fastest is kept and the plan says so. On the fixtures of two H200s
(Qwen3-8B, micro-batch 8, over NVLink: the fastest leaves about 1% free; without P2P, where the host's memory binds
the step, no kept activation pays and the fastest plan leaves two thirds of the card free) and of one H200
(Qwen3-4B, micro-batch 4, 29 GiB cap: the fastest leaves 0.08%, and every plan that frees more is over 2% slower;
at 32 GiB, the cap this test had, one 0.1% slower keeps the margin since a device layer's gradient waits in bf16)."""

import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import knobs
from slidedp.planning.report import format_plan

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _free(plan, pred):
    return 1 - pred["hbm_peak_gib"] / plan["job"]["hbm_budget_gib"]


def _fitting(plan):
    return [c for c in plan["candidates"] if c["fits"] and c["predicted"]["step_time_s"] is not None]


def _two_h200_plan(x2, link):
    topo, cal = x2
    cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8,
                               "seq_len": 2048, "optimizer": {"max_grad_norm": 0.0}})
    plan = ap.plan_job(cfg, topo[link], cal[f"qwen3-8b_bs8_{link}"])
    assert plan["feasible"], plan["errors"]
    assert _free(plan, plan["predicted"]) >= 0.05
    assert plan["headroom"]["chosen_free_fraction"] == pytest.approx(_free(plan, plan["predicted"]), abs=1e-6)
    return plan


def test_where_the_fastest_plan_keeps_the_margin_it_is_taken(x2):
    """Two H200s without P2P: the host's memory binds the step, kept activations buy nothing, and the fastest plan
    leaves most of the card free; the rule has nothing to trade."""
    plan = _two_h200_plan(x2, "pcie_host")
    room = plan["headroom"]
    assert room["outcome"] == "fastest keeps the margin" and room["slower_by_fraction"] == 0.0
    assert room["chosen_free_fraction"] == room["fastest_free_fraction"] >= room["margin_fraction"]
    # the fastest fitting candidate, short of staging slots the planner takes only where they buy SLOTS_GAIN
    # (planning/knobs.py: 12 slots price 0.9% faster here)
    fastest = min(c["predicted"]["step_time_s"] for c in _fitting(plan))
    assert fastest <= plan["predicted"]["step_time_s"] <= fastest * (1 + knobs.SLOTS_GAIN)


def test_qwen3_8b_on_two_h200s_keeps_the_margin_within_two_percent_of_the_fastest(x2):
    plan = _two_h200_plan(x2, "nvlink")
    room = plan["headroom"]
    assert room["fastest_free_fraction"] < 0.02 and room["outcome"] == "took a plan that keeps the margin"
    fastest = min(c["predicted"]["step_time_s"] for c in _fitting(plan))
    assert fastest == pytest.approx(room["fastest_step_time_s"])
    assert plan["predicted"]["step_time_s"] <= 1.02 * fastest
    assert room["slower_by_fraction"] == pytest.approx(plan["predicted"]["step_time_s"] / fastest - 1)
    text = format_plan(plan)
    assert f"headroom: took a plan {room['slower_by_fraction']:.1%} slower, " in text
    assert "Headroom: took a plan" in plan["why"]


def test_where_no_plan_within_two_percent_keeps_the_margin_the_fastest_is_kept(one_h200):
    topo, cals = one_h200
    cal = cals["calibration_qwen3-4b_bs4"]
    cfg = JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4,
                               "seq_len": 2048, "gpu_memory_gib": 29, "policy": {"delivery_cast": "host"},
                               "optimizer": {"max_grad_norm": 0.0}})
    plan = ap.plan_job(cfg, topo, cal)
    assert plan["feasible"], plan["errors"]
    room = plan["headroom"]
    assert room["outcome"].startswith("fastest kept") and room["slower_by_fraction"] == 0.0
    assert room["chosen_free_fraction"] == room["fastest_free_fraction"] < 0.05
    t = plan["predicted"]["step_time_s"]
    assert t == pytest.approx(min(c["predicted"]["step_time_s"] for c in _fitting(plan)))
    near = [c for c in _fitting(plan) if c["predicted"]["step_time_s"] <= 1.02 * t]
    assert near and all(_free(plan, c["predicted"]) < 0.05 for c in near)
    assert any(_free(plan, c["predicted"]) >= 0.05 for c in _fitting(plan))  # a roomier plan exists, slower
    assert "headroom: kept the fastest" in format_plan(plan)
