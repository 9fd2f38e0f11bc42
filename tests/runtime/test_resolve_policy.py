"""The policy a job runs with: configured keep/offload layer counts reach the engine as per-layer activations,
with the planner's plan and without one (a planner that fails is advice lost, not a changed policy)."""

from __future__ import annotations

import pytest
from slidedp import launch
from slidedp.config import JobConfig
from slidedp.planning import calibration
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
            raise RuntimeError("calibration down")
        monkeypatch.setattr(calibration, "load_or_calibrate", broken)
    policy, plan = launch.resolve_policy(_cfg({"activations": "auto", "keep_layers": keep, "offload_layers": off}),
                                         layers)
    assert bool(plan.get("policy")) == (planner == "plan")
    assert ("fallback" in plan) == (planner == "no plan")
    assert policy.activations == ("keep",) * keep + ("offload",) * off + ("checkpoint",) * (layers - keep - off)


def test_one_rank_runs_replicated_with_host_reduction_whatever_was_asked():
    """The world-of-one rule is written once (ExecutionPolicy.for_world): nothing to shard or reduce between GPUs."""
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "gpus": 0, "ranks": 1,
                               "policy": {"delivery": "sharded", "grad_reduce": "gpu", "activations": "checkpoint",
                                          "edge_update": "host", "device_layers": 0, "resident_units": 0}})
    policy, _ = launch.resolve_policy(cfg, PRESETS["tiny-qwen3"]["num_hidden_layers"])
    assert (policy.delivery, policy.grad_reduce) == ("replicated", "host")


def test_the_policy_json_round_trips_and_older_plans_still_load():
    from slidedp.policy import ExecutionPolicy, PolicyError

    pol = ExecutionPolicy.mix(4, keep=1, offload=1, resident=2, delivery="sharded", grad_reduce="gpu", window=4,
                              device_layers=3)
    d = pol.to_dict()
    assert d["staging_slots"] == 8 and d["resident"] == [True, True, True, False]  # device layers stay resident
    assert ExecutionPolicy.from_dict(d) == pol
    older = {k: v for k, v in d.items() if k not in ("staging_slots", "delivery_cast")} | {"reduce_dtype": "fp32"}
    assert ExecutionPolicy.from_dict(older) == pol
    with pytest.raises(PolicyError, match="reduce_dtype"):
        ExecutionPolicy.from_dict({**d, "reduce_dtype": "bf16"})
    with pytest.raises(PolicyError, match="window"):
        ExecutionPolicy.from_dict({**d, "window": 1})
    with pytest.raises(PolicyError, match="resident has 3 entries"):
        ExecutionPolicy.from_dict({**d, "resident": [False] * 3})


def test_a_stored_config_with_the_retired_reduce_dtype_still_loads():
    raw = {"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "policy": {"reduce_dtype": "fp32"}}
    assert JobConfig.from_dict(raw).policy.window == 3
    with pytest.raises(Exception, match="policy.reduce_dtype: was removed"):
        JobConfig.from_dict({**raw, "policy": {"reduce_dtype": "bf16"}})


@pytest.mark.parametrize("text", [
    "sharded:gpu", "replicated:host:keep", "sharded:gpu:keep6:0:2", "sharded:gpu:off5:1.0:0:gpu",
    "replicated:gpu:checkpoint:0:36:host:gpu:3", "sharded:host:offload:0:1:gpu:host:0",
])
@pytest.mark.parametrize("world", [1, 2])
def test_bench_shorthand_is_the_policy_a_job_config_resolves_to(text, world):
    """The colon form parses into the config's policy section; resolved as train() resolves it (no plan), it is
    the ExecutionPolicy from_shorthand gives, and that policy writes the same form back."""
    from slidedp import bench
    from slidedp.policy import ExecutionPolicy, resolve

    layers = 8
    cfg = JobConfig.from_dict(bench.job_config("tiny-qwen3", 0, 1, 64, 2, text, "/data.jsonl", "/out", None))
    want = resolve(cfg.policy, layers, world)
    got = ExecutionPolicy.from_shorthand(text, layers, world)
    assert got == want
    assert ExecutionPolicy.from_shorthand(got.shorthand(), layers, world) == got


def test_bench_shorthand_refuses_what_it_cannot_mean():
    from slidedp.policy import ExecutionPolicy, PolicyError, parse_shorthand

    for bad, named in [("sharded", "delivery:grad_reduce"), ("sideways:gpu", "delivery"),
                       ("sharded:gpu:keepsome", "activations"), ("sharded:gpu:keep:-1", "clip"),
                       ("sharded:gpu:keep:nan", "clip"), ("sharded:gpu:keep:0:two", "resident"),
                       ("sharded:gpu:keep:0:0:gpu:gpu:x", "device_layers"), ("a:b:c:d:e:f:g:h:i:j:k:l:m", "expected"),
                       ("sharded:gpu:keep:0:0:gpu:gpu:0:8:0:eager:3", "passes")]:
        with pytest.raises(PolicyError, match=named):
            parse_shorthand(bad)
    with pytest.raises(PolicyError, match="AutoPolicy"):
        ExecutionPolicy.from_shorthand("auto:gpu", layers=4)
    mixed = ExecutionPolicy.mix(layers=6, keep=2, offload=2, resident=0)
    with pytest.raises(PolicyError, match="no shorthand"):
        mixed.shorthand()


def test_staging_slots_are_the_policys_own_checked_and_fixed_where_the_job_fixes_them():
    """policy.staging_slots: a field of the resolved policy (AutoPolicy may choose more than the default), in its
    JSON and the bench shorthand's ninth field; fewer than window + 1 is refused by the policy and the config."""
    from slidedp.config import ConfigError
    from slidedp.policy import ExecutionPolicy, PolicyError, parse_shorthand, resolve

    pol = ExecutionPolicy.default(4, window=2, staging_slots=24)
    assert pol.to_dict()["staging_slots"] == 24 and ExecutionPolicy.from_dict(pol.to_dict()) == pol
    assert ExecutionPolicy.default(4, window=12).staging_slots == 13  # the default for the window
    wide = ExecutionPolicy.default(4, staging_slots=24)
    assert wide.shorthand().endswith(":24") and ExecutionPolicy.from_shorthand(wide.shorthand(), layers=4) == wide
    assert ExecutionPolicy.from_shorthand("replicated:host", layers=4).staging_slots == 8
    assert parse_shorthand("auto:auto:auto:0:auto:auto:auto:auto")[0].staging_slots is None  # AutoPolicy's
    assert parse_shorthand("auto:auto:auto:0:auto:auto:auto:auto:8")[0].staging_slots == 8
    with pytest.raises(PolicyError, match="staging_slots must be an integer of at least window \\+ 1 = 7"):
        ExecutionPolicy.default(4, window=6, staging_slots=6)
    with pytest.raises(PolicyError, match="staging_slots must be a count or auto"):
        ExecutionPolicy.from_shorthand("replicated:host:checkpoint:0:0:host:host:0:x", layers=4)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "policy": {"staging_slots": 5,
                                                                                          "window": 6}})
    assert err.value.errors[0]["loc"] == "policy.staging_slots" and "window + 1 = 7" in err.value.errors[0]["msg"]
    planned = ExecutionPolicy.default(4, staging_slots=32)
    asked = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}}).policy
    assert resolve(asked, 4, 1, planned).staging_slots == 32  # AutoPolicy's choice where the job leaves it
    fixed = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "policy": {"staging_slots": 12}})
    assert resolve(fixed.policy, 4, 1, planned).staging_slots == 12

