"""The planning stage reads the model's shape without transformers (slidedp.model_shape): for every preset, for
directories written by the project's own tools and for config.json files that leave keys to transformers'
defaults or set the options that add parameters, the shape is the one transformers' model on the meta device gives
(ModelAdapter, which the ranks and the fill still build); `train`'s planning stage imports no transformers; a shape
that disagrees with the built model is refused before the host state is filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from slidedp.model_shape import SHAPE_DEFAULTS, ModelOnDemand, read_shape
from slidedp.presets import PRESETS, unit_param_counts
from slidedp.step.model_adapter import ModelAdapter, load_hf_config

from scripts import first_step

TINY = {"qwen3": "tiny-qwen3", "qwen2": "tiny-qwen2", "llama": "tiny-llama", "mistral": "tiny-mistral"}


def meta_shape(model: str) -> tuple:
    """(model_type, layers, hidden, vocab, tied, per-unit parameters) of transformers' model on the meta device."""
    a = ModelAdapter(load_hf_config(model))
    return a.config.model_type, a.num_layers, a.hidden, a.vocab, a.tied, tuple(u.numel for u in a.units)


def fast_shape(model: str) -> tuple:
    s = read_shape(model)
    return s.model_type, s.num_layers, s.hidden, s.vocab, s.tied, s.unit_numels


def write_config(directory, config: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    return str(directory)


def saved_config(name: str) -> dict:
    """config.json as transformers writes it for a preset (every key explicit, as a downloaded model has it)."""
    return json.loads(load_hf_config(name).to_json_string())


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_shape_is_the_meta_model_shape(name):
    assert fast_shape(name) == meta_shape(name)
    assert list(read_shape(name).unit_numels) == unit_param_counts(PRESETS[name])  # and the planner's Job's


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_saved_config_of_each_preset_reads_as_the_meta_model_builds_it(name, tmp_path):
    model = write_config(tmp_path / name, saved_config(name))
    assert fast_shape(model) == meta_shape(model) == meta_shape(name)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3-tied", "tiny-llama"])
def test_a_directory_written_by_first_step_reads_as_the_meta_model_builds_it(name, tmp_path):
    out = str(tmp_path / name)
    first_step.write_hf_dir(out, name, seed=3, threads=1)
    assert fast_shape(out) == meta_shape(out) == meta_shape(name)


def _variants() -> list[tuple[str, str, dict]]:
    """(id, architecture, config.json) that leave shape keys to transformers' defaults or set options that add
    parameters."""
    out = []
    for arch, name in TINY.items():
        base = dict(PRESETS[name])
        out.append((f"{arch}-bare", arch, {"model_type": arch}))  # every shape key a default: a 7B-size model
        for key in SHAPE_DEFAULTS[arch]:
            out.append((f"{arch}-no-{key}", arch, {k: v for k, v in base.items() if k != key}))
        out.append((f"{arch}-kv-null", arch, {**base, "num_key_value_heads": None}))
        out.append((f"{arch}-head-dim-48", arch, {**base, "head_dim": 48}))
        out.append((f"{arch}-attention-bias", arch, {**base, "attention_bias": True}))
        out.append((f"{arch}-tied", arch, {**base, "tie_word_embeddings": True}))
        if arch in ("llama", "mistral"):
            out.append((f"{arch}-head-dim-null", arch, {**base, "head_dim": None}))
    out.append(("llama-mlp-bias", "llama", {**PRESETS["tiny-llama"], "mlp_bias": True, "attention_bias": True}))
    out.append(("mistral-head-dim-0", "mistral", {**PRESETS["tiny-mistral"], "head_dim": 0}))
    return out


@pytest.mark.parametrize("case", _variants(), ids=lambda c: c[0])
def test_a_config_json_with_defaults_and_options_reads_as_the_meta_model_builds_it(case, tmp_path):
    name, _, config = case
    model = write_config(tmp_path / name, config)
    try:
        built = meta_shape(model)
    except Exception:  # noqa: BLE001 - transformers refuses the config: so does the shape
        with pytest.raises(ValueError, match="must be a positive integer"):
            read_shape(model)
        assert name in REFUSED
        return
    assert fast_shape(model) == built


REFUSED = {"mistral-kv-null"}  # the variants transformers' config classes refuse


def test_what_transformers_refuses_is_refused_and_what_is_unsupported_is_said(tmp_path):
    qwen3_null_head = write_config(tmp_path / "q", {**PRESETS["tiny-qwen3"], "head_dim": None})
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        read_shape(qwen3_null_head)
    with pytest.raises(Exception):  # noqa: B017 - transformers' own validation error
        load_hf_config(qwen3_null_head)
    gpt2 = write_config(tmp_path / "g", {"model_type": "gpt2", "n_layer": 2})
    for read in (read_shape, load_hf_config):
        with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
            read(gpt2)
        with pytest.raises(KeyError, match="unknown model preset 'no-such-model'"):
            read("no-such-model")
        with pytest.raises(FileNotFoundError, match="does not exist"):
            read(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        read_shape(str(tmp_path))
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        read_shape(write_config(tmp_path / "h", {**PRESETS["tiny-llama"], "hidden_size": "64"}))


_PLANNING = """
import json, sys
from slidedp import launch
from slidedp.config import JobConfig
from slidedp.startup import Startup
job = json.loads(sys.argv[1])
from slidedp.planning.resolve import detect_early
cfg = JobConfig.from_dict(job)
*_, plan, layout = launch._plan(cfg, Startup(None, None), None, None, detect_early(cfg), False, lambda: None)
print(json.dumps({"transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers"),
                  "planned": bool(plan.get("policy")), "units": layout.unit_numels}))
"""

FIXED = {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint", "edge_update": "host",
         "device_layers": 0, "resident_units": 0, "delivery_cast": "host"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model, policy", [("tiny-qwen3", {}), ("qwen3-8b", FIXED), ("hf", {})])
def test_trains_planning_stage_imports_no_transformers(model, policy, tmp_path):
    """The launcher's planning stage (launch._plan: the shape, the host, the cached calibration, the plan, the
    layout), in a process of its own: a CPU job AutoPolicy plans (a preset, a written directory) and an 8B job
    that fixes its policy; the layout has the units transformers builds."""
    if model == "hf":
        model = str(tmp_path / "tiny-qwen2")
        first_step.write_hf_dir(model, "tiny-qwen2", threads=1)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(32))}) + "\n")
    job = {"model": model, "data": {"path": str(data), "format": "tokens"}, "seq_len": 32, "micro_batch_size": 1,
           "gpus": 0, "output_dir": str(tmp_path / "out"), "policy": policy}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "SLIDEDP_CACHE_DIR": str(tmp_path / "c")}

    def planning() -> dict:
        done = subprocess.run([sys.executable, "-c", _PLANNING, json.dumps(job)], env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    if not policy:  # the first plan of a CPU job measures this host (a model, in this process) and caches it
        planning()
    out = planning()  # planning from the cached calibration
    assert out["transformers"] == []
    assert out["planned"] == (not policy)
    assert tuple(out["units"]) == meta_shape(model)[-1]


def test_a_shape_that_disagrees_with_the_built_model_is_refused():
    units = list(read_shape("tiny-qwen3").unit_numels)
    assert ModelOnDemand("tiny-qwen3", units).get().num_layers == 4
    wrong = ModelOnDemand("tiny-qwen3", units[:1] + [units[1] + 1] + units[2:])
    with pytest.raises(RuntimeError, match="does not read this config as transformers does"):
        wrong.get()


_TRAIN = """
import json, sys
from slidedp.launch import train
seen = {}
def on_stage(event):
    if "progress" not in event:
        seen.setdefault(event["stage"], "transformers" in sys.modules)
result = train(json.loads(sys.argv[1]), on_stage=on_stage)
print(json.dumps({"seen": seen, "parts": result.metrics[0]["startup_parts_s"]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_imports_transformers_only_once_its_ranks_are_spawned(tmp_path):
    """A run from step 0 plans and lays out its host state without transformers; the launcher builds the meta
    model (for the fill's parameter names) at the start of building_host_state, once the ranks are spawned, and
    says how long that took (startup_parts_s)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": list(range(i, i + 32))}) + "\n" for i in range(8)))
    job = {"model": "tiny-qwen3", "data": {"path": str(data), "format": "tokens"}, "seq_len": 32,
           "micro_batch_size": 2, "steps": 1, "precision": "fp32", "export": False, "gpus": 0,
           "output_dir": str(tmp_path / "out"), "policy": FIXED}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "SLIDEDP_CACHE_DIR": str(tmp_path / "c")}
    done = subprocess.run([sys.executable, "-c", _TRAIN, json.dumps(job)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["seen"]["planning"] is False and out["seen"]["building_host_state"] is False, out
    assert out["seen"]["starting_ranks"] is True, out
    assert list(out["parts"]["building_host_state"]) == ["meta_model"], out
    assert "model_config" in out["parts"]["planning"], out


_BENCH_PLAN = """
import json, sys
from slidedp import bench
cfg = bench.job_config("tiny-qwen3", 0, 1, 32, 1, "auto:auto:auto:0:auto", sys.argv[1] + "/data.jsonl", sys.argv[1], 1)
row = bench.plan_one(cfg)
print(json.dumps({"transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers"),
                  "predicted": row["predicted_step_s"]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_plan_only_reads_the_shape_not_a_model(tmp_path):
    """`slidedp bench --plan-only` plans each policy from the model's shape: from a cached calibration it imports
    no transformers (it built a meta model for the layer count before)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "SLIDEDP_CACHE_DIR": str(tmp_path / "c")}
    runs = []
    for _ in range(2):  # the first measures this host (a model, in this process) and caches the calibration
        done = subprocess.run([sys.executable, "-c", _BENCH_PLAN, str(tmp_path / "out")], env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[1]["transformers"] == []
    assert runs[1]["predicted"] and runs[1]["predicted"] == runs[0]["predicted"]


@pytest.mark.parametrize("case", [c for c in _variants() if c[0] not in REFUSED], ids=lambda c: c[0])
def test_the_planner_and_the_request_checks_size_a_config_json_as_transformers_builds_it(case, tmp_path):
    """The planner's job (units, widths, head size and KV heads its memory model reads) and the request's host
    RAM check count each unit as the meta model holds it, for config.json files that leave keys to transformers'
    defaults (a Qwen3 config without head_dim is 128 wide per head, not hidden / heads; a Llama config without
    num_key_value_heads has as many as its attention heads) or set options that add parameters (Llama's
    mlp_bias) or do not (Mistral's attention_bias)."""
    from slidedp.config import JobConfig
    from slidedp.planning.job import Job
    from slidedp.planning.memory_model import estimate_saved_bytes
    from slidedp.validation import validate_job

    name, _, config = case
    model = write_config(tmp_path / name, config)
    a = ModelAdapter(load_hf_config(model))
    cfg = JobConfig.from_dict({"model": model, "data": {"path": "x.jsonl"}, "gpus": 0, "micro_batch_size": 1,
                               "seq_len": 64})
    topology = {"cpu": {"cores": 2}, "host_ram": {"limit_bytes": 2**50}, "gpus": []}
    job = Job.from_config(cfg, topology)
    assert tuple(job.units) == tuple(u.numel for u in a.units)
    assert (job.hidden, job.vocab, job.tied) == (a.hidden, a.vocab, a.tied)
    attn = a.layer_template.self_attn
    assert int(job.model_cfg["head_dim"]) == attn.head_dim
    assert int(job.model_cfg["num_key_value_heads"]) * attn.head_dim == attn.k_proj.out_features
    assert estimate_saved_bytes(job) > 0
    assert unit_param_counts(config) == [u.numel for u in a.units]
    errors = validate_job(cfg, host_ram_bytes=2**50)  # the dataset is not there: only what the model gives counts
    assert [e for e in errors if not e["loc"].startswith("data") and "has no weights" not in e["msg"]] == []
