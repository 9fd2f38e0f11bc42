"""Peer baseline: PyTorch FSDP2 (`fully_shard`) on a preset's shape, GPU-resident or with CPUOffloadPolicy.

    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model qwen3-8b --gpus 2 --mbs 8 --seq 2048 --keep-layers 8
    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model qwen3-8b --gpus 2 --mbs 4 --offload --threads 16
    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model qwen3-8b --gpus 2 --mbs 8 --keep-layers 8 --compiled-layers
    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model tiny-qwen3 --gpus 0 --ranks 2 --seq 32 --steps 4
    PYTHONPATH=runtime python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --peers ...   (next to SlideDP)

The model is transformers' own class for the preset (AutoModelForCausalLM, sdpa attention) built on the meta
device, each decoder layer and then the root wrapped with `fully_shard`: bf16 parameters for compute, fp32 master
parameters and fp32 gradient reduction (MixedPrecisionPolicy), which is the numerics SlideDP keeps on the host.
With `--offload`, CPUOffloadPolicy keeps the sharded fp32 parameters, gradients and AdamW state in pinned host
memory and AdamW runs on the CPU.

The peer runs at its best, because a comparison against a handicapped peer says nothing:
- AdamW is torch's fused kernel on either side (on the CPU it is 4.5x faster than foreach; a foreach offload peer
  ran 3x slower per step on the GPU machine).
- Activations are checkpointed only where needed to fit: `--keep-layers K` keeps the first K decoder layers'
  activations and recomputes the rest (K=0: every layer recomputed; omitted: nothing recomputed). Recompute is
  cheaper where backward starts soonest, so the kept layers are the first ones, whose activations live longest.
- `--compiled-layers` runs every decoder layer's forward (and so its backward) through torch.compile, as SlideDP's
  `policy.compiled_layers` does: the backend of slidedp.step.compiled (inductor on CUDA, aot_eager on the CPU, the
  same numbers as eager), one graph that every layer shares (see compile_layers). Off by default, as in SlideDP.
- CPU threads are set explicitly per rank (`--threads`, else cores // world) and reported: a launcher that leaves
  OMP_NUM_THREADS=1 makes a CPU optimizer several times slower.
- AdamW uses SlideDP's defaults (betas 0.9/0.95, eps 1e-8, no weight decay) and the same clipping mode: with
  `max_grad_norm > 0`, exact global-norm clipping by `torch.nn.utils.clip_grad_norm_` before the step.

Every rank is a fresh interpreter started by slidedp.ranks (through slidedp.peers.launch, for every peer alike),
never a fork. Ranks join through a file:// rendezvous in a private temporary directory (NCCL, one process per GPU;
gloo on loopback with `gpus=0`, which is for tests on a CPU-only machine: FSDP2, CPUOffloadPolicy and fused AdamW
all run there too, only without pinning); `rank` returns rank 0's measurements to the launcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from slidedp.peers.launch import (
    ADAMW,
    INIT_SEED,
    check_model,
    check_shape,
    cores,
    global_rows,
    init_weights,
    random_rows,
    run_ranks,
    timed_steps,
)

__all__ = ["apply_checkpointing", "compile_layers", "global_rows", "random_rows", "run_fsdp2"]


def run_fsdp2(model: str, gpus: int, mbs: int, seq: int, steps: int, warmup: int, *, offload: bool,
              keep_layers: int | None, threads: int | None, ranks: int = 0, lr: float = 1e-5,
              max_grad_norm: float = 0.0, data_rows: list[list[int]] | None = None,
              timeout_s: float = 1800.0, gpu_memory_gib: float | None = None,
              compiled_layers: bool = False) -> dict:
    """Run the FSDP2 peer in `world` fresh rank processes and return its bench row.

    world = gpus (one process per GPU, NCCL), or `ranks` gloo processes on the CPU when gpus == 0. `steps` counts
    every timed step; the first `warmup` are left out of the median. Rank r trains on rows
    [(step * world + r) * mbs, ... + mbs) of `data_rows` (wrapping around), or of random ids from a fixed seed.
    A rank failure is a row with "error" ("OOM" for torch.OutOfMemoryError), never an exception.
    `compiled_layers`: each decoder layer's forward through torch.compile (compile_layers); the row says which,
    and a compiled row's `compiled_graphs` counts the graphs rank 0 compiled for them.
    """
    world = gpus if gpus > 0 else ranks
    if world < 1:
        raise ValueError("run_fsdp2 needs gpus > 0, or ranks > 0 for the CPU form")
    check_shape(steps, mbs, seq, warmup, data_rows)
    if keep_layers is not None and keep_layers < 0:
        raise ValueError(f"keep_layers must be >= 0 or None, got {keep_layers}")
    row: dict[str, Any] = {
        "peer": "fsdp2-offload" if offload else "fsdp2", "model": model, "gpus": gpus, "world": world,
        "mbs": mbs, "seq": seq, "steps": steps, "warmup": warmup, "offload": offload,
        "keep_layers": keep_layers, "threads": threads, "lr": lr, "max_grad_norm": max_grad_norm,
        "gpu_memory_gib": gpu_memory_gib, "compiled_layers": bool(compiled_layers),
    }
    return run_ranks("slidedp.peers.fsdp2", row, world, timeout_s, data_rows=data_rows)


# ---------------------------------------------------------------------------------------------- rank side
def apply_checkpointing(layers, keep_layers: int | None) -> None:
    """Recompute every decoder layer but the first `keep_layers` in backward (None: keep every layer's activations).

    The layer's forward is wrapped, not its __call__, so FSDP2's unshard/reshard hooks stay outside the checkpoint
    and the recompute reuses the all-gather that backward does anyway (as torchtitan's checkpoint_wrapper inside
    fully_shard). Non-reentrant checkpointing takes the keyword tensors transformers passes to its layers.
    """
    from torch.utils.checkpoint import checkpoint

    def checkpointed(forward):
        def run(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    if keep_layers is None:
        return
    for layer in layers[keep_layers:]:
        layer.forward = checkpointed(layer.forward)


def compile_layers(layers, backend) -> None:
    """Each decoder layer's forward through torch.compile (`backend`: slidedp.step.compiled.compile_backend's).

    The layer's forward is compiled, not its __call__, and before apply_checkpointing wraps it: FSDP2's
    unshard/reshard hooks (on __call__) and the checkpoint (around the compiled forward) stay eager, and the graph
    holds the layer's compute only, as in SlideDP's compiled layer. The other orders were tried: compiling the
    checkpointed forward or the whole module puts the checkpoint inside the graph, where a side effect of the
    layer's forward (a context variable transformers sets) breaks the graph and leaves the checkpointed layers
    eager. The layers are distinct modules, but dynamo caches by code object and takes a module's parameters as
    graph inputs (inline_inbuilt_nn_modules), so one graph serves every layer and its recompute in backward; the
    recompile limit is raised as SlideDP's is all the same, so that no layer can fall back to eager silently.
    """
    import torch

    from slidedp.step.compiled import raise_limits

    raise_limits()
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend, dynamic=False)


def _train(a: dict, link) -> dict:
    rank, world = link.rank, link.world
    check_model(a["model"])
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from slidedp.step.compiled import compile_backend
    from slidedp.step.model_adapter import load_hf_config

    cuda = a["gpus"] > 0
    torch.set_num_threads(a["threads"] or max(1, cores() // world))
    device = link.join(cuda, a.get("gpu_memory_gib")).device  # the same cap as SlideDP's ranks get
    mesh = init_device_mesh(device.type, (world,))

    cfg = load_hf_config(a["model"])  # sdpa attention, no KV cache
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    model.train()
    layers = model.model.layers
    if a.get("compiled_layers"):
        compile_layers(layers, compile_backend(device))
    apply_checkpointing(layers, a["keep_layers"])
    shard: dict[str, Any] = {"mesh": mesh,
                             "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                               reduce_dtype=torch.float32)}
    if a["offload"]:
        shard["offload_policy"] = CPUOffloadPolicy(pin_memory=cuda)
    for layer in layers:
        fully_shard(layer, **shard)
    fully_shard(model, **shard)
    model.to_empty(device="cpu" if a["offload"] else device)
    torch.manual_seed(INIT_SEED + rank)
    init_weights(model, float(getattr(cfg, "initializer_range", 0.02)))
    # to_empty left the rotary buffers (inv_freq) uninitialised: build them again, on the compute device
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a["lr"], fused=True, **ADAMW)
    params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size

    clip = a["max_grad_norm"]
    norms: list = []

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss  # labels are shifted inside the model
        loss.backward()
        if clip > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    out = timed_steps(a, rank, world, cfg.vocab_size, device, step)
    grad_norms = None
    if norms:
        grad_norms = [float(n.full_tensor() if hasattr(n, "full_tensor") else n) for n in norms]
    # graphs dynamo made for the layers: 1 where every layer and recompute shares one, more where some recompiled
    extra = {}
    if a.get("compiled_layers"):
        from torch._dynamo.utils import counters

        extra["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
    return {**out, "params": params, "grad_norms": grad_norms, "extra": extra}


def rank(a: dict, link) -> dict:
    """One rank of the run (started by run_ranks through slidedp.ranks): its measurements."""
    return _train(a, link)


# ---------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m slidedp.peers.fsdp2",
                                description="FSDP2 peer baseline; prints one JSON row.")
    p.add_argument("--model", required=True, help="a preset name (slidedp.presets) or a local HF model directory")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (one rank each); 0: CPU ranks over gloo")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks when --gpus 0")
    p.add_argument("--mbs", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8, help="timed steps, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--offload", action="store_true", help="CPUOffloadPolicy with fused CPU AdamW")
    p.add_argument("--keep-layers", type=int, default=None,
                   help="checkpoint every decoder layer but the first K (0: all); omitted: no checkpointing")
    p.add_argument("--compiled-layers", action="store_true",
                   help="each decoder layer's forward through torch.compile (inductor on CUDA, aot_eager on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per rank (default cores // world)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-grad-norm", type=float, default=0.0, help="> 0: exact global-norm clipping")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are killed")
    args = p.parse_args(argv)
    row = run_fsdp2(args.model, args.gpus, args.mbs, args.seq, args.steps, args.warmup, offload=args.offload,
                    keep_layers=args.keep_layers, threads=args.threads, ranks=args.ranks, lr=args.lr,
                    max_grad_norm=args.max_grad_norm, timeout_s=args.timeout, compiled_layers=args.compiled_layers)
    print(json.dumps(row))
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    sys.exit(main())
