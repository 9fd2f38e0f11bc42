"""Units updated on the ranks' devices (policy.edge_update: gpu for the embedding and head, policy.device_layers
for leading decoder layers) train the same bits as the host update, are never delivered from the host, and leave
the host state whole for checkpoints.

CPU, real gloo ranks: the device is the CPU, so both paths run the same fused AdamW on the same fp32 shards and
must agree bit for bit (losses, grad norms, clip decisions, master weights and both moments after the last step,
as the final checkpoint holds them: written back from the devices). Cases: 2 ranks bf16 sharded delivery, tied
embeddings, clipping that fires and gradient accumulation, edges and one layer on the device; 1 rank fp32 (untied
head) with edges and two layers; 1 rank bf16 with clipping and two layers whose gradients wait in bf16; 3 ranks fp32 replicated delivery with two layers and the edges on the host; 1 rank
bf16 with every unit on the device (the host update has nothing to do, yet every step must finish).
"""

from __future__ import annotations

import os

import pytest
import slidedp
import torch
from slidedp.config import ConfigError, JobConfig
from slidedp.presets import PRESETS, unit_param_counts

from tests.runtime.exactness import make_model_dir, make_token_data, slidedp_tensors

STEPS, SEQ, MBS = 3, 24, 2

CASES = {
    "2ranks-bf16-clip-accum": {"ranks": 2, "precision": "bf16", "grad_accum": 2, "max_grad_norm": 0.05,
                               "delivery": "sharded", "preset": "tiny-qwen3-tied", "edge": "gpu", "layers": 1},
    "1rank-fp32": {"ranks": 1, "precision": "fp32", "grad_accum": 1, "max_grad_norm": 0.0,
                   "delivery": "replicated", "preset": "tiny-llama", "edge": "gpu", "layers": 2},
    "3ranks-layers-only": {"ranks": 3, "precision": "fp32", "grad_accum": 1, "max_grad_norm": 0.05,
                           "delivery": "replicated", "preset": "tiny-qwen3", "edge": "host", "layers": 2},
    # one rank, bf16, no accumulation: the device layers' gradients wait in bf16 (held_in_bf16)
    "1rank-bf16-layers-held-in-bf16": {"ranks": 1, "precision": "bf16", "grad_accum": 1, "max_grad_norm": 0.05,
                                       "delivery": "replicated", "preset": "tiny-qwen3", "edge": "gpu", "layers": 2},
    # no unit left to the host update: the updater still reports each step's norm and clip decision
    "1rank-everything-on-the-device": {"ranks": 1, "precision": "bf16", "grad_accum": 2, "max_grad_norm": 0.05,
                                       "delivery": "replicated", "preset": "tiny-qwen3", "edge": "gpu",
                                       "layers": 4},
}


def device_runs(root, case: dict, gpus: int = 0) -> dict:
    """The same job with every unit updated on the host, and with the case's units updated on the device (the
    host run keeps the same layers resident, so both deliver them at most once per step)."""
    model = make_model_dir(str(root / "model"), case["preset"])
    world = gpus or case["ranks"]
    rows = MBS * world * case["grad_accum"] * STEPS
    data = make_token_data(str(root / "data.jsonl"), rows=rows, seq_len=SEQ)
    out = {}
    for where in ("host", "gpu"):
        d = str(root / where)
        result = slidedp.train({
            "model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": SEQ,
            "micro_batch_size": MBS, "grad_accum": case["grad_accum"], "steps": STEPS,
            "ranks": 1 if gpus else case["ranks"], "gpus": gpus, "precision": case["precision"],
            "output_dir": d, "export": False, "cpu_threads": 1,
            "optimizer": {"lr": 3e-3, "weight_decay": 0.1, "max_grad_norm": case["max_grad_norm"]},
            "schedule": {"warmup_steps": 1, "decay": "linear"},
            "policy": {"delivery": case["delivery"], "grad_reduce": "gpu", "activations": "checkpoint",
                       "resident_units": case["layers"], "edge_update": case["edge"] if where == "gpu" else "host",
                       "device_layers": case["layers"] if where == "gpu" else 0},
            "checkpoint": {"interval": STEPS, "keep": 1},
            "deterministic": bool(gpus),
        })
        assert result.status == "completed"
        out[where] = {"result": result, "tensors": slidedp_tensors(
            os.path.join(d, "checkpoints", f"step-{STEPS:08d}"), model)}
    return out


# the 2-rank case in the quick set; the others with the slow suites (make test-fast stays under 10 min)
QUICK = ("2ranks-bf16-clip-accum", "1rank-everything-on-the-device")
PARAMS = [pytest.param(name, marks=() if name in QUICK else pytest.mark.slow) for name in CASES]


@pytest.fixture(scope="module", params=PARAMS, ids=list(CASES))
def runs(request, tmp_path_factory):
    case = CASES[request.param]
    return {"case": case, **device_runs(tmp_path_factory.mktemp("device"), case)}


def test_device_edge_update_trains_the_same_bits(runs):
    assert_same_bits(runs)


def assert_same_bits(runs: dict) -> None:
    host, gpu = runs["host"], runs["gpu"]
    assert len(host["result"].metrics) == len(gpu["result"].metrics) == STEPS
    for a, b in zip(host["result"].metrics, gpu["result"].metrics):
        assert (a["loss"], a["grad_norm"], a["clipped"]) == (b["loss"], b["grad_norm"], b["clipped"]), a["step"]
    if runs["case"]["max_grad_norm"] > 0:
        assert any(r["clipped"] for r in host["result"].metrics)  # the clip path ran
    changed = 0
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for name, t in host["tensors"][kind].items():
            assert torch.equal(t, gpu["tensors"][kind][name]), (kind, name)
            changed += kind == "exp_avg" and bool(t.abs().sum() > 0)
    assert changed > 0  # the moments were written back, not left at zero


def test_units_updated_on_the_device_are_not_delivered_from_the_host(runs):
    case = runs["case"]
    numels = unit_param_counts(PRESETS[case["preset"]])
    world = case["ranks"]
    esize = 2 if case["precision"] == "bf16" else 4
    host_h2d = sum(runs["host"]["result"].metrics[-1]["bytes"]["h2d"])
    gpu_h2d = sum(runs["gpu"]["result"].metrics[-1]["bytes"]["h2d"])
    # each such unit is delivered once per step on the host path (the layers are resident there): all of it
    # (replicated, per rank) or one shard per rank (sharded: the ranks' shards add up to the unit)
    per_rank = 1 if case["delivery"] == "sharded" else world
    units = list(range(1, 1 + case["layers"])) + ([0, len(numels) - 1] if case["edge"] == "gpu" else [])
    assert host_h2d - gpu_h2d == sum(numels[u] for u in units) * esize * per_rank
    policy = runs["gpu"]["result"].policy
    assert (policy.edge_update, policy.device_layers) == (case["edge"], case["layers"])


def test_edge_update_on_the_gpu_needs_the_gpu_gradient_route():
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "ranks": 2,
                             "policy": {"grad_reduce": "host", "edge_update": "gpu"}})
    assert exc.value.errors[0]["loc"] == "policy.edge_update"
    # one rank has no gradient route to choose: accepted
    JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "ranks": 1,
                         "policy": {"grad_reduce": "host", "edge_update": "gpu", "device_layers": 2}})
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "ranks": 2,
                             "policy": {"grad_reduce": "host", "device_layers": 1}})
    assert exc.value.errors[0]["loc"] == "policy.device_layers"


class _HostUnits:
    """The host state's views DeviceUpdate.load reads, for one unit (no page-locked ranges)."""

    def __init__(self, master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor):
        self._t = {"master": master, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}

    def master_unit(self, u: int) -> torch.Tensor:
        return self._t["master"]

    def exp_avg_unit(self, u: int) -> torch.Tensor:
        return self._t["exp_avg"]

    def exp_avg_sq_unit(self, u: int) -> torch.Tensor:
        return self._t["exp_avg_sq"]

    def dma_pieces(self, view: torch.Tensor) -> list[tuple[int, int]]:
        return [(0, view.numel())]


def test_a_run_from_step_0_reads_only_the_master_of_a_device_updated_unit():
    """Moments of a fresh host state are zero (pages the launcher is still faulting in): the device's start with
    zeros of their own and are not read; a resumed run reads them. Host moments filled with 7s show which."""
    from slidedp.config import OptimizerConfig, ScheduleConfig
    from slidedp.step.device_update import DeviceUpdate
    from slidedp.step.devices import Streams
    from slidedp.step.routes import Routes, ShardMap

    n = 10
    host = _HostUnits(torch.arange(float(n)), torch.full((n,), 7.0), torch.full((n,), 7.0))
    shards = ShardMap([n, n, n], 1, 0)
    cpu = torch.device("cpu")
    routes = Routes("replicated", "host", shards, Streams(cpu), None, None, 1 << 20)
    for moments in (False, True):
        dev = DeviceUpdate(units=[1], state=host, shards=shards, routes=routes, buffers={1: torch.zeros(n)},
                           opt=OptimizerConfig(), sched=ScheduleConfig(), total_steps=3, device=cpu)
        dev.load(moments=moments)
        assert torch.equal(dev.master[1], torch.arange(float(n)))
        expected = torch.full((n,), 7.0) if moments else torch.zeros(n)
        assert torch.equal(dev.exp_avg[1], expected) and torch.equal(dev.exp_avg_sq[1], expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("chunk", [4096, 96])
def test_a_layer_gradient_held_in_bf16_updates_to_the_same_bits(monkeypatch, chunk, device):
    """With one rank and bf16 layers a device layer's gradient waits in bf16 (held_in_bf16: 14 B/param of device
    state, not 16) and is widened a chunk at a time for the update. Against the same unit held in fp32: the same
    norm, master and moments after three clipped steps, whether the unit is one chunk or several with a shorter
    last one. (A chunk is the whole unit or STREAM_CHUNK, 2^24: its bounds are multiples of any vector width, which
    the CPU kernel needs for the same bits: its scalar tail rounds differently.) On the CPU, and on a GPU where
    there is one (the fused CUDA kernel, the copy streams)."""
    from slidedp.config import OptimizerConfig, ScheduleConfig
    from slidedp.step import device_update as du
    from slidedp.step.devices import Streams
    from slidedp.step.routes import Routes, ShardMap

    n = 1000
    monkeypatch.setattr(du, "chunk_elements", lambda lens: min(chunk, max(lens)))
    gen = torch.Generator().manual_seed(3)
    master = torch.randn(n, generator=gen)
    grads = [(torch.randn(n, generator=gen) * 3).bfloat16().float() for _ in range(3)]  # bf16 values, as in bf16 layers
    shards = ShardMap([n, n, n], 1, 0)
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU here")
    dev_t = torch.device(device)
    opt = OptimizerConfig(lr=1e-2, weight_decay=0.1, max_grad_norm=1.0)
    out = {}
    for hold in ((), (1,)):
        routes = Routes("replicated", "gpu", shards, Streams(dev_t), None, None, 1 << 20)
        host = _HostUnits(master.clone(), torch.zeros(n), torch.zeros(n))
        dev = du.DeviceUpdate(units=[1], state=host, shards=shards, routes=routes,
                              buffers={1: torch.zeros(n, device=dev_t)}, opt=opt, sched=ScheduleConfig(),
                              total_steps=3, device=dev_t, hold_bf16=hold)
        dev.load(moments=False)
        assert dev.grad[1].dtype == (torch.bfloat16 if hold else torch.float32)
        norms = []
        for step, g in enumerate(grads, start=1):
            dev.reduce(1, g.to(dev_t))
            if dev_t.type == "cuda":  # the engine keeps the norm on the d2h stream, as the routes sum it
                torch.cuda.synchronize()
            dev.keep_norm()
            norms.append(float(dev._global_sumsq))
            routes.sumsq.zero_()
            dev.update(step)
        if dev_t.type == "cuda":
            torch.cuda.synchronize()
        out[hold] = (norms, *(t[1].cpu() for t in (dev.master, dev.exp_avg, dev.exp_avg_sq)))
    fp32, bf16 = out[()], out[(1,)]
    assert fp32[0] == bf16[0] and all(s > 1.0 for s in fp32[0])  # the same norms, over max_grad_norm: clipped
    for a, b in zip(fp32[1:], bf16[1:]):
        assert torch.equal(a, b)
    assert not torch.equal(fp32[1], master)
