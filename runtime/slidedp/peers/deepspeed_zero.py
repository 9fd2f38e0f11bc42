"""Peer baseline: DeepSpeed ZeRO-Offload on a preset's shape — ZeRO-2 with the optimizer on the CPU, or ZeRO-3
with the parameters there too.

    scripts/build_peer_wheels.sh      # once, where there is a package index: DeepSpeed + deps -> .device-wheels/
    python3 -m pip install --no-index --no-deps --target /tmp/peer-pkgs .device-wheels/*.whl   # on the GPU machine
    PYTHONPATH=/tmp/peer-pkgs:runtime python3 -m slidedp.peers.deepspeed_zero --model qwen3-8b --gpus 2 --mbs 4 \\
        --stage 2 --threads 16
    PYTHONPATH=/tmp/peer-pkgs:runtime python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 4 \\
        --policies sharded:gpu --peers ds-zero2,ds-zero3:1.0           (next to SlideDP; `:1.0` clips at norm 1)

DeepSpeed is no dependency of slidedp: without it a run returns an error row and starts no process.

What runs: transformers' own class for the preset (sdpa attention), built on the meta device in bf16 and
materialised on the GPU with the normal(0, 0.02) init every peer uses; `deepspeed.initialize` then takes it with
- ZeRO-2: bf16 parameters on the GPU, gradients reduce-scattered, fp32 master weights and AdamW moments in pinned
  host memory, updated there by DeepSpeedCPUAdam (classic ZeRO-Offload);
- ZeRO-3: the same, and the bf16 parameters partitioned into pinned host memory too, fetched layer by layer
  (DeepSpeed partitions the already-built model itself, rank 0's weights broadcast first: at most one bf16 copy
  per GPU, never a full model in host memory, so 8B on two ranks stays far from a 256 GiB host's limit).
Every decoder layer is recomputed in backward (torch's non-reentrant checkpoint around each layer, as
transformers' gradient_checkpointing_enable does); the data, the learning rate and the clipping are the bench's.

The peer runs at its best, because a comparison against a handicapped peer says nothing:
- The optimizer is DeepSpeed's own vectorised CPU AdamW (DeepSpeedCPUAdam, selected by the config's optimizer
  block with offload, never a torch optimizer handed in); the row names the class that actually ran.
- CPU threads are explicit per rank: `threads` (else cores // world) goes to OMP_NUM_THREADS in the rank's
  environment, for the OpenMP team of the CPU Adam op, and to torch.set_num_threads. A launcher that leaves
  OMP_NUM_THREADS=1 (torchrun does) made DeepSpeed's CPU Adam 3.3x slower on the GPU machine.
- Communication overlaps compute (overlap_comm, contiguous gradients, 500M-element buckets; for ZeRO-3 a 500M
  prefetch bucket, 1B live parameters and layers under 1M parameters kept resident), the settings of the
  DeepSpeed baseline measured on the GPU machine. Gradients travel in DeepSpeed's default bf16 (reported).
- Recomputing every layer costs this peer little: for Qwen3-8B at bs4 it is ≈6 ms per layer, ≈0.2 s of a
  ZeRO-Offload step measured at ≈4.2 s on the GPU machine, which the CPU update and host traffic bound, not the GPU.
- AdamW uses SlideDP's defaults (betas 0.9/0.95, eps 1e-8, no weight decay); `max_grad_norm > 0` is DeepSpeed's
  gradient_clipping, exact global-norm clipping as SlideDP's.

The CPU Adam op is compiled on first use (torch's JIT extension build, cached in ~/.cache/torch_extensions): the
machine needs a C++ compiler and ninja, and the first run pays the build (a minute or more, in setup_s, outside the
timed steps). If ninja is not on PATH, the ranks get the `bin` folder next to the installed deepspeed (where
pip --target puts the ninja wheel's binary). Ranks are started by slidedp.ranks through slidedp.peers.launch (fresh
interpreters, a file:// rendezvous); the process group is initialised here before `deepspeed.initialize`, which adopts it, and
RANK, LOCAL_RANK and WORLD_SIZE are in the environment for DeepSpeed to read. With gpus=0 the ranks run DeepSpeed's
CPU accelerator over gloo, a form for checking the code path on a machine without GPUs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from typing import Any

from slidedp.peers.launch import (
    ADAMW,
    INIT_SEED,
    check_model,
    check_shape,
    cores,
    init_weights,
    run_ranks,
    timed_steps,
)

MISSING = "deepspeed is not installed: run scripts/build_peer_wheels.sh and install .device-wheels (see the script)"
BUCKET = 500_000_000  # elements per reduce / all-gather / prefetch bucket


def zero_config(stage: int, mbs: int, lr: float, max_grad_norm: float, threads: int) -> dict:
    """The DeepSpeed config of the peer: ZeRO `stage` (2 or 3) with CPU offload, bf16, DeepSpeedCPUAdam.

    `threads` is checked but has no key here: DeepSpeed's CPU Adam takes its thread count from OpenMP
    (OMP_NUM_THREADS in the rank's environment), not from its config.
    """
    if stage not in (2, 3):
        raise ValueError(f"ZeRO stage must be 2 or 3, got {stage}")
    if mbs < 1 or threads < 1 or lr <= 0 or max_grad_norm < 0:
        raise ValueError(f"bad settings: mbs={mbs} threads={threads} lr={lr} max_grad_norm={max_grad_norm}")
    pinned_cpu = {"device": "cpu", "pin_memory": True}
    zero: dict[str, Any] = {
        "stage": stage, "offload_optimizer": dict(pinned_cpu),
        "overlap_comm": True, "contiguous_gradients": True,
        "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET,
    }
    if stage == 3:
        zero.update({"offload_param": dict(pinned_cpu), "stage3_prefetch_bucket_size": BUCKET,
                     "stage3_param_persistence_threshold": 1_000_000, "stage3_max_live_parameters": 1_000_000_000})
    return {
        "train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "gradient_clipping": max_grad_norm,
        # "AdamW" with optimizer offload and torch_adam off is what makes DeepSpeed build DeepSpeedCPUAdam
        "optimizer": {"type": "AdamW", "params": {
            "lr": lr, "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"],
            "torch_adam": False, "adam_w_mode": True}},
        "steps_per_print": 1_000_000, "wall_clock_breakdown": False,
    }


def run_deepspeed(model: str, gpus: int, mbs: int, seq: int, steps: int, warmup: int, *, stage: int,
                  threads: int | None, lr: float = 1e-5, max_grad_norm: float = 0.0,
                  data_rows: list[list[int]] | None = None, timeout_s: float = 1800.0, ranks: int = 0,
                  gpu_memory_gib: float | None = None) -> dict:
    """Run the DeepSpeed ZeRO-Offload peer in `world` fresh rank processes and return its bench row.

    world = gpus (one process per GPU, NCCL), or `ranks` gloo processes on DeepSpeed's CPU accelerator when
    gpus == 0. `steps` counts every timed step; the first `warmup` are left out of the median. Rank r trains on
    rows global_rows(step, r, world, mbs) of `data_rows` (wrapping around), or of random ids from a fixed seed.
    A rank failure is a row with "error" ("OOM" for torch.OutOfMemoryError), never an exception; so is a missing
    deepspeed, found before any process starts.
    """
    world = gpus if gpus > 0 else ranks
    if world < 1:
        raise ValueError("run_deepspeed needs gpus > 0, or ranks > 0 for the CPU form")
    check_shape(steps, mbs, seq, warmup, data_rows)
    threads = threads or max(1, cores() // world)
    config = zero_config(stage, mbs, lr, max_grad_norm, threads)
    row: dict[str, Any] = {
        "peer": f"ds-zero{stage}", "model": model, "gpus": gpus, "world": world, "mbs": mbs, "seq": seq,
        "steps": steps, "warmup": warmup, "stage": stage,
        "offload": "optimizer" if stage == 2 else "optimizer+parameters", "keep_layers": 0, "threads": threads,
        "lr": lr, "max_grad_norm": max_grad_norm, "optimizer": "DeepSpeedCPUAdam", "ds_config": config,
        "gpu_memory_gib": gpu_memory_gib,
    }
    site = deepspeed_site()
    if site is None:
        return dict(row, error=MISSING)
    env = {"OMP_NUM_THREADS": str(threads), "DS_ACCELERATOR": "cuda" if gpus > 0 else "cpu"}
    ninja_dir = os.path.join(site, "bin")
    if shutil.which("ninja") is None and os.path.isfile(os.path.join(ninja_dir, "ninja")):
        env["PATH"] = ninja_dir + os.pathsep + os.environ.get("PATH", "")
    return run_ranks("slidedp.peers.deepspeed_zero", row, world, timeout_s, data_rows=data_rows, env=env)


def deepspeed_site() -> str | None:
    """The folder deepspeed is installed in (site-packages or a pip --target), or None; imports nothing.

    Importing deepspeed would import torch into the launching process, which stays free of it.
    """
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))


# ---------------------------------------------------------------------------------------------- rank side
def _train(a: dict, link) -> dict:
    rank, world = link.rank, link.world
    check_model(a["model"])
    import torch
    from transformers import AutoModelForCausalLM

    from slidedp.peers.fsdp2 import apply_checkpointing
    from slidedp.step.model_adapter import load_hf_config

    cuda = a["gpus"] > 0
    torch.set_num_threads(a["threads"])
    device = link.join(cuda, a.get("gpu_memory_gib")).device  # the same cap as SlideDP's ranks get
    # imported once the group exists: deepspeed.initialize then wraps it instead of starting its own rendezvous
    import deepspeed

    setup_t0 = time.perf_counter()
    cfg = load_hf_config(a["model"])  # sdpa attention, no KV cache
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    model.to(torch.bfloat16)  # on meta: free; the GPU then holds one bf16 copy, not an fp32 one
    model.to_empty(device=device)
    torch.manual_seed(INIT_SEED)  # DeepSpeed broadcasts rank 0's weights in any case
    init_weights(model, float(getattr(cfg, "initializer_range", 0.02)))
    # to_empty left the rotary buffers (inv_freq) uninitialised: build them again, in fp32 (DeepSpeed casts
    # parameters to bf16 and leaves buffers as they are)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg).to(device)
    model.train()
    apply_checkpointing(model.model.layers, keep_layers=0)
    params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them to empty tensors
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=a["ds_config"])
    setup_s = time.perf_counter() - setup_t0  # includes the CPU Adam op's build on a first run

    clip = a["max_grad_norm"]
    if cuda:
        # the peak is the training's: under ZeRO-3 the whole bf16 model sat on the GPU until initialize
        # partitioned it, and the allocator would otherwise keep those blocks reserved
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    norms: list[float] = []

    def step(ids):
        loss = engine(input_ids=ids, labels=ids).loss  # labels are shifted inside the model
        engine.backward(loss)
        engine.step()
        return loss

    def read_norm() -> None:  # outside the timing, as before the step's figures are read
        if clip > 0:
            norms.append(float(engine.get_global_grad_norm()))

    out = timed_steps(a, rank, world, cfg.vocab_size, device, step, read_norm)
    return {
        **out, "params": params, "grad_norms": norms or None,
        "extra": {"optimizer": type(engine.basic_optimizer).__name__, "deepspeed": deepspeed.__version__,
                  "grad_comm_dtype": str(engine.communication_data_type).removeprefix("torch."),
                  "setup_s": setup_s},
    }


def rank(a: dict, link) -> dict:
    """One rank of the run (started by run_ranks through slidedp.ranks): its measurements."""
    return _train(a, link)


# ---------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m slidedp.peers.deepspeed_zero",
                                description="DeepSpeed ZeRO-Offload peer baseline; prints one JSON row.")
    p.add_argument("--model", required=True, help="a preset name (slidedp.presets) or a local HF model directory")
    p.add_argument("--stage", type=int, choices=(2, 3), default=2,
                   help="2: optimizer offloaded to the CPU; 3: parameters offloaded too")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (one rank each); 0: CPU ranks over gloo")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks when --gpus 0")
    p.add_argument("--mbs", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8, help="timed steps, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per rank (default cores // world)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-grad-norm", type=float, default=0.0, help="> 0: DeepSpeed's gradient_clipping")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are killed")
    args = p.parse_args(argv)
    row = run_deepspeed(args.model, args.gpus, args.mbs, args.seq, args.steps, args.warmup, stage=args.stage,
                        threads=args.threads, lr=args.lr, max_grad_norm=args.max_grad_norm,
                        timeout_s=args.timeout, ranks=args.ranks)
    print(json.dumps(row))
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    sys.exit(main())
