"""policy.compiled_layers: the decoder layers through torch.compile train to the numbers of the eager layers.

On the CPU the compiled layers use the "aot_eager" backend, which traces the layer with dynamo and runs
AOTAutograd's forward and backward graphs (the same capture inductor compiles on CUDA) without generating kernels,
so the numbers must agree with eager to float rounding.
"""

from __future__ import annotations

import os
import re

import pytest
import slidedp
import torch
from slidedp.config import ConfigError, JobConfig
from slidedp.policy import ExecutionPolicy, PolicyError, parse_shorthand, resolve

from tests.runtime.exactness import make_model_dir, make_token_data, rel_err, slidedp_tensors

STEPS, SEQ, MBS = 3, 32, 2  # 2 x 32 x 64 hidden states: at the 4096 elements an offloaded layer copies out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled")
    return {"model": make_model_dir(str(root / "model"), "tiny-qwen3"),
            "data": make_token_data(str(root / "data.jsonl"), rows=2 * MBS * STEPS, seq_len=SEQ), "root": root}


def _train(workdir, name: str, policy: dict) -> dict:
    out = os.path.join(workdir["root"], name)
    result = slidedp.train({
        "model": workdir["model"], "data": {"path": workdir["data"], "format": "tokens", "shuffle": False},
        "seq_len": SEQ, "micro_batch_size": MBS, "grad_accum": 2, "steps": STEPS, "ranks": 1, "gpus": 0,
        "precision": "fp32", "output_dir": out, "export": False, "cpu_threads": 1,
        "optimizer": {"lr": 3e-3, "eps": 1e-6, "max_grad_norm": 0.5},
        "policy": {"delivery": "replicated", "grad_reduce": "host", **policy},
        "checkpoint": {"interval": STEPS, "keep": 1},
    })
    assert result.status == "completed" and result.steps_done == STEPS
    assert result.policy.compiled_layers is bool(policy.get("compiled_layers"))  # the run record's policy
    assert result.plan["policy"]["compiled_layers"] is bool(policy.get("compiled_layers"))  # and its plan's
    return {"metrics": result.metrics, "out": out,
            "tensors": slidedp_tensors(os.path.join(out, "checkpoints", f"step-{STEPS:08d}"), workdir["model"])}


# keep, offload and checkpointed layers in one run (the tiny model has 4): the graph path with the saved-tensor
# hooks (weights by reference, activations copied out and back), and the no-graph forward with its recompute
MIX = {"activations": "auto", "keep_layers": 1, "offload_layers": 1}


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_compiled_layers_train_to_the_eager_numbers_without_recompiling(workdir, monkeypatch, capfd):
    eager = _train(workdir, "eager", MIX)
    monkeypatch.setenv("TORCH_LOGS", "recompiles,graph_breaks")
    capfd.readouterr()
    compiled = _train(workdir, "compiled", {**MIX, "compiled_layers": True})
    logged = capfd.readouterr()
    log = logged.out + logged.err
    # The rank compiled the layer: dynamo logs the one recompile a grad mode needs (the checkpointed forward and
    # evaluation run without a graph, kept / offloaded / recomputed layers with one) and nothing for a second
    # layer, whose parameters are other tensors of the same shapes; no graph break splits the layer.
    recompiles = re.findall(r"Recompiling function (\w+)", log)
    assert recompiles == ["_eager"], log[-4000:]
    assert "grad_mode" in log or "requires_grad" in log, log[-4000:]
    assert "Graph break" not in log, log[-4000:]
    for a, b in zip(eager["metrics"], compiled["metrics"], strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-6 * abs(a["grad_norm"]), (a["step"], a["grad_norm"],
                                                                                   b["grad_norm"])
        # the offloaded layer copied its saved tensors out: the compiled graph's, which AOTAutograd's partitioner
        # picks (fewer: it recomputes cheap ones in the backward; 475136 against 655360 bytes a step here)
        assert 0 < b["bytes"]["d2h"][0] <= a["bytes"]["d2h"][0], (a["bytes"], b["bytes"])
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for name, t in eager["tensors"][kind].items():
            assert rel_err(compiled["tensors"][kind][name], t) <= 1e-5, (kind, name)


def test_compiled_layer_one_graph_per_grad_mode_for_every_layer():
    """In-process: three layers' parameter views of two window buffers, forward without a graph and forward with
    leaves then backward (the recompute), give eager's outputs and gradients from two compiled graphs."""
    from slidedp.step.compiled import CompiledLayer, layer_function
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    assert layer_function(adapter, False, torch.device("cpu")) == adapter.layer_forward
    assert layer_function(adapter, True, torch.device("cpu")).backend == "aot_eager"  # the CPU's: no kernels made
    layer = CompiledLayer(adapter, "aot_eager")
    spec = adapter.units[1]
    gen = torch.Generator().manual_seed(0)
    bufs = [torch.randn(spec.numel + 64, generator=gen) * 0.05 for _ in range(2)]
    h = torch.randn(MBS, SEQ, adapter.hidden, generator=gen)
    pos = torch.arange(SEQ).expand(MBS, SEQ)
    ctx = {"attention_mask": None, "position_ids": pos, "position_embeddings": adapter.rotary("cpu")(h, pos)}
    for i in range(3):
        buf = bufs[i % 2][i * 16:]  # another buffer or offset per layer, as window slots give
        with torch.no_grad():
            params = adapter.param_views(spec, buf)
            torch.testing.assert_close(layer(params, h, ctx), adapter.layer_forward(params, h, ctx), rtol=0, atol=0)
        grads = []
        for fn in (layer, adapter.layer_forward):
            leaves = {k: v.detach().requires_grad_(True) for k, v in adapter.param_views(spec, buf).items()}
            x = h.detach().requires_grad_(True)
            with torch.enable_grad():
                out = fn(leaves, x, ctx)
            torch.autograd.backward(out, torch.ones_like(out))
            grads.append([x.grad] + [leaves[p.name].grad for p in spec.params])
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert counters["aot_autograd"]["total"] == 2, dict(counters["aot_autograd"])


def test_compiled_layers_key_parses_resolves_and_reaches_the_plan():
    base = {"model": "tiny-qwen3", "data": {"path": "x.jsonl"}}
    assert JobConfig.from_dict(base).policy.compiled_layers is None  # the planner's choice: eager for now
    assert JobConfig.from_dict(base).policy.fixed() == {}
    cfg = JobConfig.from_dict({**base, "policy": {"compiled_layers": True}})
    assert cfg.policy.compiled_layers is True and cfg.policy.fixed() == {"compiled_layers": True}
    assert JobConfig.from_dict({**base, "policy": {"compiled_layers": False}}).policy.fixed() == {"compiled_layers": False}
    for bad in ("yes", 1):
        with pytest.raises(ConfigError, match=r"policy\.compiled_layers"):
            JobConfig.from_dict({**base, "policy": {"compiled_layers": bad}})
    pol = resolve(cfg.policy, layers=4, world=1)
    assert pol.compiled_layers is True
    assert pol.to_dict()["compiled_layers"] is True and ExecutionPolicy.from_dict(pol.to_dict()) == pol
    planned = ExecutionPolicy.default(4, compiled_layers=True)
    assert resolve(JobConfig.from_dict(base).policy, 4, 1, planned=planned).compiled_layers is True
    assert resolve(JobConfig.from_dict(base).policy, 4, 1).compiled_layers is False
    old = ExecutionPolicy.default(4).to_dict()
    del old["compiled_layers"]  # a plan written before the key
    assert ExecutionPolicy.from_dict(old).compiled_layers is False
    with pytest.raises(PolicyError, match="compiled_layers"):
        ExecutionPolicy.default(4, compiled_layers="yes")
    # bench's shorthand: an eleventh field, eager (default) or compiled
    assert parse_shorthand("sharded:gpu")[0].compiled_layers is None  # omitted: the planner's choice (eager)
    assert parse_shorthand("sharded:gpu:keep1:0:0:host:host:0:8:0:eager")[0].compiled_layers is False
    assert parse_shorthand("sharded:gpu:keep1:0:0:host:host:0:8:0:compiled")[0].compiled_layers is True
    with pytest.raises(PolicyError, match="layers must be one of eager, compiled"):
        parse_shorthand("sharded:gpu:keep1:0:0:host:host:0:8:0:fast")
    pol = ExecutionPolicy.from_shorthand("replicated:host:keep1:0:0:host:host:0:8:0:compiled", layers=4)
    assert pol.compiled_layers and ExecutionPolicy.from_shorthand(pol.shorthand(), layers=4) == pol
    assert ExecutionPolicy.default(4).shorthand().count(":") == 7


def test_layer_profile_compiled_reports_the_same_phases_through_the_compiled_layer(tmp_path):
    """scripts/layer_profile.py --compiled: the eager run as before, and under "compiled" the same figures of the
    layer through the engine's compiled layer (the CPU's aot_eager capture): every GEMM of every phase, two graphs
    (grad and no-grad), no graph break, and the per-phase speed-up."""
    import json

    from scripts import layer_profile

    out = tmp_path / "layers.json"
    layer_profile.main(["--model", "tiny-qwen3", "--seq", "32", "--mbs", "1", "--iters", "1", "--warmup", "1",
                        "--device", "cpu", "--compiled", "--out", str(out)])
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["compiled"] is True
    run = written["models"]["tiny-qwen3"]["32"]
    comp = run["compiled"]
    assert comp["compile"]["backend"] == "aot_eager" and comp["compile"]["first_iteration_s"] > 0
    assert (comp["compile"]["unique_graphs"], comp["compile"]["graph_breaks"]) == (2, 0)
    assert set(comp["phases"]) == set(run["phases"]) == set(layer_profile.PHASES)
    for phase, r in comp["phases"].items():
        assert r["classes"]["gemm"]["count"] == 7 * layer_profile.PHASE_FORWARDS[phase], phase
        assert r["flops"] == run["phases"][phase]["flops"] and r["wall_ms"] > 0, phase
        assert comp["speedup"][phase] == pytest.approx(run["phases"][phase]["wall_ms"] / r["wall_ms"])


@pytest.mark.parametrize(("name", "cls"), [
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norm"),
    ("triton_poi_fused_mul_sigmoid_2", "activation"),
    ("triton_poi_fused_add_cat_mul_neg_slice_3", "rope"),
    ("triton_poi_fused__to_copy_0", "cast"),
    ("triton_poi_fused_add_mul_4", "fused"),
])
def test_generated_triton_kernels_are_classed_by_the_ops_in_their_names(name, cls):
    from scripts import layer_profile

    assert layer_profile.classify(name) == cls


def test_a_plan_with_compiled_layers_says_its_compute_is_priced_eager():
    """Where the calibration has no compiled layer (a declared host's figures), a plan that runs them compiled says
    its prediction is priced with eager layers; a plan without says nothing of it."""
    from slidedp.planning import autopolicy as ap
    from slidedp.planning import profiles

    prof = profiles.load("1x-l40s-256g")
    said = {}
    for compiled in (False, True):
        cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 1,
                                   "micro_batch_size": 2, "seq_len": 2048,
                                   "policy": {"compiled_layers": compiled}})
        plan = ap.plan_for(cfg, profiles.declared_topology(prof), profiles.declared_calibration(cfg, prof))
        assert plan.policy["compiled_layers"] is compiled
        said[compiled] = ("Compiled layers (as configured): a declared host's figures time eager layers only, so "
                          "the step is priced with eager layers" in plan.why)
    assert said == {False: False, True: True}
