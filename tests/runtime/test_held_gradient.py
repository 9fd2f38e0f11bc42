"""The gradient held for exact clipping: only for units updated on the host, and in bf16 where that loses nothing
(one rank, bf16 layers, no accumulation: slidedp.step.layout.held_in_bf16). A bf16 hold trains the same bits as
an fp32 one (CPU, one rank, clipping that fires on every step), and Qwen3-8B at micro-batch 8 on one GPU of a
128 GiB host, refused with clipping on before (the whole gradient waited in host memory in fp32), now fits."""

from __future__ import annotations

import json
import os

import pytest
import slidedp
import torch
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.policy import ExecutionPolicy
from slidedp.step import layout as layout_mod
from slidedp.step.layout import plan_layout

from tests.runtime.exactness import make_model_dir, make_token_data, slidedp_tensors

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
GIB = 2**30
STEPS = 3
NUMELS = [1000, 300, 300, 300, 1000]  # embedding, three layers, head


def _pol(**over) -> ExecutionPolicy:
    return ExecutionPolicy.mix(layers=3, keep=0, offload=0, resident=0, **over)


@pytest.mark.parametrize("world,precision,accum,bf16", [
    (1, "bf16", 1, True),
    (2, "bf16", 1, False),  # a sum over ranks is an fp32 sum
    (1, "bf16", 2, False),  # so is an accumulation over micro-batches
    (1, "fp32", 1, False),
])
def test_layers_are_held_in_bf16_only_where_their_gradient_is_a_bf16_tensor(world, precision, accum, bf16):
    lay = plan_layout(NUMELS, world, _pol(), precision, clip=True, directory="", grad_accum=accum)
    assert lay.held_bf16 == ((1, 2, 3) if bf16 else ())
    layers = 900
    assert lay.parts()["held_gradient"] == 2000 * 4 + layers * (2 if bf16 else 4)  # the edges always in fp32


def test_units_updated_on_the_gpu_hold_nothing_on_the_host():
    lay = plan_layout(NUMELS, 1, _pol(edge_update="gpu", device_layers=1), "bf16", clip=True, directory="")
    assert set(lay.held_places()) == {2, 3}
    assert lay.parts()["held_gradient"] == 600 * 2
    assert plan_layout(NUMELS, 1, _pol(), "bf16", clip=False, directory="").parts()["held_gradient"] == 0


def test_held_places_pack_each_kind_apart():
    lay = plan_layout(NUMELS, 1, _pol(), "bf16", clip=True, directory="")
    assert lay.held_places() == {0: ("held", 0), 1: ("held16", 0), 2: ("held16", 300), 3: ("held16", 600),
                                 4: ("held", 1000)}
    assert lay.held_numels() == {"held": 2000, "held16": 900}


def _train(root, model, data, tag: str) -> dict:
    out = str(root / tag)
    result = slidedp.train({
        "model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": 24,
        "micro_batch_size": 2, "steps": STEPS, "ranks": 1, "gpus": 0, "precision": "bf16", "output_dir": out,
        "export": False, "cpu_threads": 1,
        "optimizer": {"lr": 3e-3, "max_grad_norm": 0.05},  # below the tiny model's norm: clips every step
        "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint",
                   "resident_units": 0, "delivery_cast": "host", "edge_update": "host", "device_layers": 0},
        "checkpoint": {"interval": STEPS, "keep": 1},
    })
    assert result.status == "completed"
    return {"metrics": result.metrics,
            "tensors": slidedp_tensors(os.path.join(out, "checkpoints", f"step-{STEPS:08d}"), model)}


def test_a_bf16_hold_trains_the_same_bits_as_an_fp32_hold(tmp_path, monkeypatch):
    model = make_model_dir(str(tmp_path / "model"), "tiny-qwen3")
    data = make_token_data(str(tmp_path / "data.jsonl"), rows=2 * STEPS, seq_len=24)
    cfg = JobConfig.from_dict({"model": model, "data": {"path": data}, "precision": "bf16", "gpus": 0, "ranks": 1,
                               "optimizer": {"max_grad_norm": 0.05}})
    from slidedp.launch import host_layout
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    numels = [u.numel for u in ModelAdapter(load_hf_config(model)).units]
    assert host_layout(cfg, numels, ExecutionPolicy.default(len(numels) - 2)).held_bf16  # the run holds bf16
    bf16 = _train(tmp_path, model, data, "bf16")
    monkeypatch.setattr(layout_mod, "held_in_bf16", lambda *a: ())  # the launcher lays out an fp32 hold
    fp32 = _train(tmp_path, model, data, "fp32")
    assert all(m["clipped"] for m in bf16["metrics"]), "clipping must fire for the hold to matter"
    for a, b in zip(bf16["metrics"], fp32["metrics"]):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for name, t in bf16["tensors"][kind].items():
            assert torch.equal(t, fp32["tensors"][kind][name]), (kind, name)


def test_qwen3_8b_with_clipping_fits_one_gpu_of_a_128_gib_host():
    """Regression: with clipping at 1.0 this job was refused ("host RAM too small ... held_gradient 30.5 GiB"):
    every unit's gradient waited in host memory in fp32. Now the layers wait in bf16 and the embedding and head,
    updated on the GPU to fit, wait nowhere on the host."""
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    assert topo["host_ram"]["limit_bytes"] == 128 * GIB
    cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 8,
                               "seq_len": 2048, "cpu_threads": 16, "optimizer": {"max_grad_norm": 1.0}})
    plan = ap.plan_job(cfg, topo, None)
    assert plan["feasible"], plan["errors"]
    host = plan["predicted"]["host_parts_gib"]
    assert host["held_gradient"] == pytest.approx(6.95e9 * 2 / GIB, rel=0.01)
    assert plan["policy"]["edge_update"] == "gpu"
    assert sum(host.values()) <= 128
