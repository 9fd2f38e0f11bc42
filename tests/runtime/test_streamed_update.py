"""policy.streamed_layers: the update after the norm of the layers right after the device layers streams their host
state through the device (here layers 1-2 of 4, the host updating 3-4 and the embedding and head).
On CPU ranks the device's AdamW is the host's kernel, so a run with streamed layers trains the same bits as the
host update (which tests/runtime/test_exactness.py holds to torch AdamW + clip_grad_norm_): one rank in bf16
(gradients waiting in bf16) and two gloo ranks in fp32 (reduce-scattered shards), clipping on every step and off."""

from __future__ import annotations

import os

import pytest
import slidedp
import torch
from slidedp.config import ConfigError, JobConfig
from slidedp.policy import ExecutionPolicy, PolicyError, resolve
from slidedp.step.layout import plan_layout

from tests.runtime.exactness import make_model_dir, make_token_data, slidedp_tensors

STEPS = 3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("streamed")
    return {"root": root, "model": make_model_dir(str(root / "model"), "tiny-qwen3"),
            "data": make_token_data(str(root / "data.jsonl"), rows=4 * STEPS, seq_len=24)}


def _train(files, tag: str, *, ranks: int, precision: str, clip: float, streamed: int, accum: int = 1,
           cast: str = "host") -> dict:
    out = str(files["root"] / f"{tag}-{ranks}-{precision}-{clip}-{streamed}-{accum}-{cast}")
    result = slidedp.train({
        "model": files["model"], "data": {"path": files["data"], "format": "tokens", "shuffle": False},
        "seq_len": 24, "micro_batch_size": 2 // accum, "grad_accum": accum, "steps": STEPS, "ranks": ranks,
        "gpus": 0, "precision": precision,
        "output_dir": out, "export": False, "cpu_threads": 1,
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1, "max_grad_norm": clip},
        "policy": {"delivery": "sharded" if ranks > 1 else "replicated", "grad_reduce": "gpu" if ranks > 1 else "host",
                   "activations": "checkpoint", "resident_units": 0, "delivery_cast": cast, "edge_update": "host",
                   "device_layers": 0, "streamed_layers": streamed},
        "checkpoint": {"interval": STEPS, "keep": 1},
    })
    assert result.status == "completed"
    return {"metrics": result.metrics,
            "tensors": slidedp_tensors(os.path.join(out, "checkpoints", f"step-{STEPS:08d}"), files["model"])}


# (ranks, precision, clip, accumulation, delivery_cast): the updated weights that stay on the device for the next
# forward are bf16 over a bf16 hold (one rank), fp32 over fp32 (two ranks, all-gathered), bf16 over an fp32 hold
# (accumulation; two ranks in bf16), and the fp32 master cast on the device
# make test-fast keeps its 10 minutes with the first and the last case; make test runs every one
CASES = [(1, "bf16", 0.05, 1, "host"),
         *(pytest.param(*c, marks=pytest.mark.slow) for c in [(2, "fp32", 0.05, 1, "host"), (1, "bf16", 0.0, 1, "host"),
                                                                (1, "bf16", 0.05, 2, "host"), (2, "bf16", 0.05, 1, "host")]),
         (1, "bf16", 0.05, 1, "gpu")]


@pytest.mark.parametrize("ranks,precision,clip,accum,cast", CASES)
def test_streamed_layers_train_the_same_bits_as_the_host_update(files, ranks, precision, clip, accum, cast):
    host = _train(files, "host", ranks=ranks, precision=precision, clip=clip, streamed=0, accum=accum, cast=cast)
    streamed = _train(files, "streamed", ranks=ranks, precision=precision, clip=clip, streamed=2, accum=accum,
                      cast=cast)
    if clip:
        assert all(m["clipped"] for m in host["metrics"]), "clipping must fire for the clip factor to matter"
    for a, b in zip(host["metrics"], streamed["metrics"]):
        assert (a["loss"], a["grad_norm"], a["clipped"]) == (b["loss"], b["grad_norm"], b["clipped"])
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for name, t in host["tensors"][kind].items():
            assert torch.equal(t, streamed["tensors"][kind][name]), (kind, name)
    assert any(not torch.equal(t, torch.zeros_like(t)) for t in streamed["tensors"]["exp_avg"].values())
    # from the second step on the streamed layers come from the device, not over the link: fewer bytes in
    h2d = [sum(m["bytes"]["h2d"]) for m in streamed["metrics"]]
    assert h2d[1] < h2d[0] and h2d[2] == h2d[1], h2d
    plain = [sum(m["bytes"]["h2d"]) for m in host["metrics"]]
    assert plain[0] == plain[1] == plain[2], plain


def test_streamed_layers_follow_the_device_layers_and_hold_nothing_on_the_host():
    """The streamed layers are the ones right after the device layers, so the host's post-norm updates are of the
    last layers, which the next forward needs last (docs/planning.md, "The streamed update")."""
    pol = ExecutionPolicy.mix(layers=4, keep=0, offload=0, resident=0, device_layers=1, streamed_layers=2)
    assert pol.streamed_units() == {2, 3} and pol.device_units() == {1}
    assert ExecutionPolicy.mix(layers=4, keep=0, offload=0, resident=0, streamed_layers=1).streamed_units() == {1}
    lay = plan_layout([100, 10, 10, 10, 10, 100], 1, pol, "bf16", clip=True, directory="")
    assert set(lay.held_places()) == {0, 4, 5}
    assert lay.slot_numel == 100  # staging still sized for the head, which goes to the host


def test_streamed_layers_beyond_the_layers_above_the_device_layers_are_refused():
    with pytest.raises(PolicyError, match=r"streamed_layers must be in 0\.\.3"):
        ExecutionPolicy.mix(layers=4, keep=0, offload=0, resident=0, device_layers=1, streamed_layers=4)
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "ranks": 2,
                               "policy": {"streamed_layers": 9}})
    assert resolve(cfg.policy, 4, 2).streamed_layers == 4  # at most the model's layers
    assert resolve(cfg.policy, 4, 2).grad_reduce == "gpu"


def test_streamed_layers_with_host_reduction_on_several_ranks_is_a_config_error():
    with pytest.raises(ConfigError, match="policy.streamed_layers"):
        JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "ranks": 2,
                             "policy": {"streamed_layers": 2, "grad_reduce": "host"}})


def test_the_shorthand_names_streamed_layers():
    pol = ExecutionPolicy.from_shorthand("replicated:host:checkpoint:1:0:gpu:gpu:0:9:5", layers=36)
    assert pol.streamed_layers == 5 and pol.staging_slots == 9
    assert ExecutionPolicy.from_shorthand(pol.shorthand(), layers=36) == pol
