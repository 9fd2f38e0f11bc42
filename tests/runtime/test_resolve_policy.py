"""The policy a job runs with: configured keep/offload layer counts reach the engine as per-layer activations,
with the planner's plan and without one (a planner that fails is advice lost, not a changed policy)."""

from __future__ import annotations

import pytest
from slidedp import launch
from slidedp.config import JobConfig
from slidedp.planning import autopolicy
from slidedp.presets import PRESETS


def _cfg(policy: dict) -> JobConfig:
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "gpus": 0, "ranks": 2,
                                "micro_batch_size": 2, "seq_len": 32, "policy": policy})


@pytest.mark.parametrize("planner", ["plan", "no plan"])
@pytest.mark.parametrize("keep,off", [(0, 2), (1, 2), (2, 0)])
def test_keep_and_offload_counts_reach_the_engine(monkeypatch, planner, keep, off):
    layers = PRESETS["tiny-qwen3"]["num_hidden_layers"]
    if planner == "no plan":
        def broken(*_a, **_k):
            raise RuntimeError("planner down")
        monkeypatch.setattr(autopolicy, "plan_job", broken)
    policy, plan = launch.resolve_policy(_cfg({"activations": "auto", "keep_layers": keep, "offload_layers": off}),
                                         layers)
    assert bool(plan) == (planner == "plan")
    assert policy["activations"] == ["keep"] * keep + ["offload"] * off + ["checkpoint"] * (layers - keep - off)
