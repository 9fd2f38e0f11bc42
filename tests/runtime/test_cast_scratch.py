"""policy.cast_scratch_mb: the delivery cast through a ring of fp32 scratch buffers (slidedp.step.cast_ring). Its
geometry, the config's checks, the plan carrying it and the memory model counting it; the cast's bits on a GPU are
tests/gpu/test_gpu_cast_ring.py's."""

import pytest
from slidedp.config import ConfigError, JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning.memory_model import ALLOCATOR_SLACK
from slidedp.policy import ExecutionPolicy, PolicyError
from slidedp.step.cast_ring import ring_geometry

MIB = 2**20


def test_the_ring_is_half_chunk_buffers_within_the_scratch():
    assert ring_geometry(256 * MIB, 64 * MIB, 4) == (8, 8 * MIB)  # eight buffers of 32 MiB of fp32
    assert ring_geometry(256 * MIB, 256 * MIB, 4) == (2, 32 * MIB)  # a chunk's two halves
    assert ring_geometry(32 * MIB, 64 * MIB, 4) == (2, 4 * MIB)  # smaller than a chunk: its own two halves
    n, each = ring_geometry(100 * MIB, 64 * MIB, 4)
    assert n == 3 and n * each * 4 <= 100 * MIB
    with pytest.raises(ValueError, match="two buffers"):
        ring_geometry(4, 64 * MIB, 4)


def _job(policy: dict, **over) -> dict:
    cfg = {"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4, "seq_len": 2048,
           "cpu_threads": 16, "optimizer": {"max_grad_norm": 0.0}, "policy": policy}
    cfg.update(over)
    return cfg


def test_a_scratch_for_a_cast_the_job_never_makes_is_refused_by_name():
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(_job({"cast_scratch_mb": 256, "delivery_cast": "host"}))
    assert any(e["loc"] == "policy.cast_scratch_mb" and "delivery_cast" in e["msg"] for e in err.value.errors)
    # with the cast left to AutoPolicy the key waits for its choice; a job that casts nowhere (on the CPU, or in
    # fp32) never reads it, as it never reads chunk_mb
    for over in ({}, {"gpus": 0}, {"precision": "fp32"}):
        assert JobConfig.from_dict(_job({"cast_scratch_mb": 256}, **over)).policy.cast_scratch_mb == 256


def test_a_negative_scratch_is_refused():
    with pytest.raises(ConfigError):
        JobConfig.from_dict(_job({"cast_scratch_mb": -1, "delivery_cast": "gpu"}))
    with pytest.raises(PolicyError, match="cast_scratch_mb"):
        ExecutionPolicy.default(4, cast_scratch_mb=-1)


def test_policy_json_without_the_key_is_the_default_scratch():
    pol = ExecutionPolicy.default(4, delivery_cast="gpu", cast_scratch_mb=256)
    d = pol.to_dict()
    assert d["cast_scratch_mb"] == 256 and ExecutionPolicy.from_dict(d) == pol
    del d["cast_scratch_mb"]  # a plan or stored job written before the key
    assert ExecutionPolicy.from_dict(d).cast_scratch_mb == 0


def _plan(one_h200, policy: dict) -> dict:
    topo, cals = one_h200
    plan = ap.plan_job(JobConfig.from_dict(_job(policy, gpu_memory_gib=40.0)), topo,
                       cals["calibration_qwen3-4b_bs4"])
    assert plan["feasible"], plan["errors"]
    return plan


def test_the_plan_keeps_the_scratch_and_counts_it_in_gpu_memory(one_h200):
    fixed = {"delivery_cast": "gpu", "activations": "checkpoint", "resident_units": 0, "device_layers": 0,
             "edge_update": "host", "window": 3, "chunk_mb": 64, "loss_chunk_tokens": 2048}
    plain = _plan(one_h200, fixed)
    ring = _plan(one_h200, {**fixed, "cast_scratch_mb": 256})
    assert plain["policy"]["cast_scratch_mb"] == 0 and ring["policy"]["cast_scratch_mb"] == 256
    assert "cast_scratch" not in plain["predicted"]["hbm_parts_gib"]
    # the plan's parts, as its peak, carry the allocator's slack
    assert ring["predicted"]["hbm_parts_gib"]["cast_scratch"] == pytest.approx(0.25 * (1 + ALLOCATOR_SLACK))
    grew = ring["predicted"]["hbm_peak_gib"] - plain["predicted"]["hbm_peak_gib"]
    assert grew == pytest.approx(0.25 * (1 + ALLOCATOR_SLACK), abs=0.01)


def test_bench_sets_policy_keys_beyond_its_shorthand():
    """`slidedp bench --policy-set cast_scratch_mb=256` runs every SlideDP policy of the command with the key; a
    key that is not a policy key, or an item without a value, is refused before any set-up."""
    from slidedp import bench

    keys = bench.parse_policy_set("cast_scratch_mb=256, chunk_mb=256,delivery_cast=gpu")
    assert keys == {"cast_scratch_mb": 256, "chunk_mb": 256, "delivery_cast": "gpu"}
    cfg = bench.job_config("qwen3-4b", 1, 4, 2048, 4, "replicated:host:checkpoint:0:0:gpu:host:0", "x.jsonl", "/o",
                           None, policy_set=keys)
    job = JobConfig.from_dict(cfg)
    assert (job.policy.cast_scratch_mb, job.policy.chunk_mb, job.policy.delivery_cast) == (256, 256, "gpu")
    for bad, says in (("cast_scratch=256", "not a policy key"), ("cast_scratch_mb", "KEY=VALUE")):
        with pytest.raises(ValueError, match=says):
            bench.parse_policy_set(bad)
    assert bench.main(["--model", "qwen3-4b", "--policy-set", "nope=1", "--policies", "auto:auto"]) == 2


def test_slidedp_plan_names_the_scratch_only_where_the_job_asks_for_one(one_h200):
    from slidedp.planning.plan import Plan
    from slidedp.planning.report import format_plan

    fixed = {"delivery_cast": "gpu", "activations": "checkpoint", "resident_units": 0, "device_layers": 0}
    assert "cast_scratch_mb=256" in format_plan(Plan.from_dict(_plan(one_h200, {**fixed, "cast_scratch_mb": 256})))
    assert "cast_scratch_mb" not in format_plan(Plan.from_dict(_plan(one_h200, fixed)))
