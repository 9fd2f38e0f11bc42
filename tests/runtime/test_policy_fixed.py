"""What the user fixed is decided in one place, PolicyConfig.fixed(): AutoPolicy's planner treats exactly those
keys as fixed, `resolve` keeps exactly those over a plan's choices, the bench shorthand parses into the same
PolicyConfig as the equivalent YAML `policy` section, and a bench row's `chosen` is the ExecutionPolicy's summary."""

import json
import os

import pytest
import yaml
from slidedp import bench
from slidedp.config import JobConfig, PolicyConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning.job import Job
from slidedp.planning.memory_model import ActivationSizes
from slidedp.policy import ExecutionPolicy, parse_shorthand, resolve

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _cfg(policy: dict) -> JobConfig:
    return JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8,
                                "seq_len": 2048, "policy": policy})


# (the config's policy section, what the user fixed): `auto`, null and a tuned knob at its default leave the choice
SECTIONS = [
    ({}, {}),
    ({"delivery": "auto", "grad_reduce": "auto", "delivery_cast": "auto", "edge_update": "auto"}, {}),
    ({"delivery": "replicated"}, {"delivery": "replicated"}),
    ({"grad_reduce": "host"}, {"grad_reduce": "host"}),
    ({"activations": "keep"}, {"activations": "keep"}),
    ({"keep_layers": 4}, {"keep_layers": 4}),
    ({"offload_layers": 0}, {"offload_layers": 0}),
    ({"resident_units": 0}, {"resident_units": 0}),
    ({"resident_units": 3}, {"resident_units": 3}),
    ({"delivery_cast": "host"}, {"delivery_cast": "host"}),
    ({"edge_update": "gpu"}, {"edge_update": "gpu"}),
    ({"device_layers": 0}, {"device_layers": 0}),
    ({"device_layers": 2}, {"device_layers": 2}),
    ({"window": 3}, {}),
    ({"window": 4}, {"window": 4}),
    ({"chunk_mb": 64}, {}),
    ({"chunk_mb": 16}, {"chunk_mb": 16}),
    ({"loss_chunk_tokens": 4096}, {}),
    ({"loss_chunk_tokens": 2048}, {"loss_chunk_tokens": 2048}),
    ({"staging_slots": 12}, {"staging_slots": 12}),
]


@pytest.mark.parametrize("section,fixed", SECTIONS, ids=[json.dumps(s) for s, _ in SECTIONS])
def test_fixed_names_each_key_the_user_set_and_the_planner_treats_the_same_keys_as_fixed(x2, section, fixed):
    topo, _ = x2
    cfg = _cfg(section)
    assert cfg.policy.fixed() == fixed
    job = Job.from_config(cfg, topo["nvlink"])
    planner = ap._Planner(cfg, job, None, ActivationSizes.of(job, None))
    assert planner.fixed == fixed


# (the config key, the ExecutionPolicy field resolve fills from it)
DIRECT = {"delivery": "delivery", "grad_reduce": "grad_reduce", "edge_update": "edge_update",
          "device_layers": "device_layers", "delivery_cast": "delivery_cast", "window": "window",
          "chunk_mb": "chunk_mb", "loss_chunk_tokens": "loss_chunk_tokens", "staging_slots": "staging_slots"}


@pytest.mark.parametrize("section", [s for s, _ in SECTIONS], ids=[json.dumps(s) for s, _ in SECTIONS])
def test_resolve_keeps_what_the_user_fixed_and_takes_the_plan_for_the_rest(section):
    """A plan that differs from the config in every choice: each fixed key comes from the config, each other one
    from the plan."""
    layers = 6
    planned = ExecutionPolicy.mix(layers, keep=1, offload=1, resident=2, delivery="replicated", grad_reduce="gpu",
                                  edge_update="host", device_layers=1, delivery_cast="gpu", window=6, chunk_mb=256,
                                  loss_chunk_tokens=1024, staging_slots=32)
    requested = _cfg(section).policy
    run = resolve(requested, layers, 2, planned)
    fixed = requested.fixed()
    for key, field in DIRECT.items():
        want = fixed[key] if key in fixed else getattr(planned, field)
        if key == "grad_reduce" and (run.edge_update == "gpu" or run.device_layers):
            want = "gpu"  # updates on the GPUs reduce there, whatever was asked
        assert getattr(run, field) == want, key
    want_acts = (fixed["activations"],) * layers if "activations" in fixed else planned.activations
    assert run.activations == want_acts
    want_resident = tuple(i < fixed["resident_units"] for i in range(layers)) if "resident_units" in fixed \
        else planned.resident
    assert run.resident == tuple(r or i < run.device_layers for i, r in enumerate(want_resident))


# (bench shorthand, the YAML policy section that asks for the same)
SHORTHANDS = [
    ("sharded:gpu", """
        delivery: sharded
        grad_reduce: gpu
        activations: checkpoint
        resident_units: 0
        delivery_cast: host
        edge_update: host
        device_layers: 0
        staging_slots: 8
        streamed_layers: 0
     """),
    ("auto:auto", """
        activations: checkpoint
        resident_units: 0
        edge_update: host
        device_layers: 0
     """),
    ("auto:auto:auto:0:auto:auto:auto:auto", "{}"),
    ("sharded:gpu:keep4:0.5:2", """
        delivery: sharded
        grad_reduce: gpu
        activations: auto
        keep_layers: 4
        offload_layers: 0
        resident_units: 2
        delivery_cast: host
        edge_update: host
        device_layers: 0
        staging_slots: 8
        streamed_layers: 0
     """),
    ("replicated:host:off18:1.0:0:gpu", """
        delivery: replicated
        grad_reduce: host
        activations: auto
        keep_layers: 0
        offload_layers: 18
        resident_units: 0
        delivery_cast: gpu
        edge_update: host
        device_layers: 0
        staging_slots: 8
        streamed_layers: 0
     """),
    ("auto:auto:keep:0:auto:host:gpu:auto:12", """
        activations: keep
        delivery_cast: host
        edge_update: gpu
        staging_slots: 12
     """),
]


@pytest.mark.parametrize("text,section", SHORTHANDS, ids=[t for t, _ in SHORTHANDS])
def test_a_shorthand_parses_to_the_policy_config_of_its_yaml_section(text, section):
    requested, _ = parse_shorthand(text)
    assert isinstance(requested, PolicyConfig)
    assert requested == _cfg(yaml.safe_load(section)).policy
    # the bench's job config carries what the shorthand fixed, and asks for the same policy
    job = JobConfig.from_dict(bench.job_config("qwen3-8b", 2, 8, 2048, 4, text, "x.jsonl", "/tmp/out", None))
    assert job.policy == requested


def test_only_a_shorthand_that_fixes_every_choice_is_an_execution_policy():
    assert ExecutionPolicy.from_shorthand("sharded:gpu:keep4:0:2", layers=6, world=2) == resolve(
        parse_shorthand("sharded:gpu:keep4:0:2")[0], 6, 2)
    for text in ("auto:gpu", "sharded:gpu:auto", "sharded:gpu:keep:0:auto", "sharded:gpu:keep:0:0:auto",
                 "sharded:gpu:keep:0:0:host:auto", "sharded:gpu:keep:0:0:host:host:auto",
                 "sharded:gpu:keep:0:0:host:host:0:auto"):
        with pytest.raises(ValueError, match="AutoPolicy"):
            ExecutionPolicy.from_shorthand(text, layers=6, world=2)


def test_a_bench_rows_chosen_is_the_policys_summary():
    pol = ExecutionPolicy.mix(8, keep=2, offload=3, resident=1, delivery="sharded", grad_reduce="gpu",
                              device_layers=2, edge_update="gpu", delivery_cast="gpu", window=4)
    assert pol.summary() == {"delivery": "sharded", "grad_reduce": "gpu", "window": 4, "delivery_cast": "gpu",
                             "edge_update": "gpu", "device_layers": 2, "streamed_layers": 0, "keep_layers": 2,
                             "offload_layers": 3, "resident_layers": 2, "compiled_layers": False,
                             "post_norm_passes": 1, "chunk_mb": 64, "loss_chunk_tokens": 4096,
                             "cast_scratch_mb": 0}


def test_a_job_is_sized_the_same_whatever_cast_the_user_fixed(x2):
    """The cast is the policy's: the job AutoPolicy prices both casts from is the same for every setting of it."""
    topo, _ = x2
    jobs = [Job.from_config(_cfg({"delivery_cast": cast}), topo["nvlink"]) for cast in ("auto", "host", "gpu")]
    assert jobs[0] == jobs[1] == jobs[2]
