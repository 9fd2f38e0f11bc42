"""Peer baseline: PyTorch FSDP2 (`fully_shard`) on a preset's shape, GPU-resident or with CPUOffloadPolicy.

    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model qwen3-8b --gpus 2 --mbs 8 --seq 2048 --keep-layers 8
    PYTHONPATH=runtime python3 -m slidedp.peers.fsdp2 --model qwen3-8b --gpus 2 --mbs 4 --offload --threads 16
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
- CPU threads are set explicitly per rank (`--threads`, else cores // world) and reported: a launcher that leaves
  OMP_NUM_THREADS=1 makes a CPU optimizer several times slower.
- AdamW uses SlideDP's defaults (betas 0.9/0.95, eps 1e-8, no weight decay) and the same clipping mode: with
  `max_grad_norm > 0`, exact global-norm clipping by `torch.nn.utils.clip_grad_norm_` before the step.

Every rank is a fresh interpreter (`python -m slidedp.peers.fsdp2 ARGS_FILE RANK WORLD`), never a fork: CUDA and
fork do not mix, and a fresh process measures the peer as a user would run it. Ranks join through a file://
rendezvous in a private temporary directory (NCCL, one process per GPU; gloo on loopback with `gpus=0`, which is
for tests on a CPU-only machine: FSDP2, CPUOffloadPolicy and fused AdamW all run there too, only without pinning).
Each rank writes its result as JSON next to the rendezvous file; the launching process imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

# Set in the rank processes unless the caller already chose: NVLink multicast (NVLS) is off on the GPU machine.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}  # SlideDP's optimizer defaults
DATA_SEED = 0
INIT_SEED = 0
FAILED_RANK_GRACE_S = 10.0  # after one rank fails, the others get this long to report before they are killed
LOG_TAIL_CHARS = 3000


def run_fsdp2(model: str, gpus: int, mbs: int, seq: int, steps: int, warmup: int, *, offload: bool,
              keep_layers: int | None, threads: int | None, ranks: int = 0, lr: float = 1e-5,
              max_grad_norm: float = 0.0, data_rows: list[list[int]] | None = None,
              timeout_s: float = 1800.0) -> dict:
    """Run the FSDP2 peer in `world` fresh rank processes and return its bench row.

    world = gpus (one process per GPU, NCCL), or `ranks` gloo processes on the CPU when gpus == 0. `steps` counts
    every timed step; the first `warmup` are left out of the median. Rank r trains on rows
    [(step * world + r) * mbs, ... + mbs) of `data_rows` (wrapping around), or of random ids from a fixed seed.
    A rank failure is a row with "error" ("OOM" for torch.OutOfMemoryError), never an exception.
    """
    world = gpus if gpus > 0 else ranks
    if world < 1:
        raise ValueError("run_fsdp2 needs gpus > 0, or ranks > 0 for the CPU form")
    if steps < 1 or mbs < 1 or seq < 2 or warmup < 0:
        raise ValueError(f"bad shape: steps={steps} mbs={mbs} seq={seq} warmup={warmup}")
    if keep_layers is not None and keep_layers < 0:
        raise ValueError(f"keep_layers must be >= 0 or None, got {keep_layers}")
    if data_rows is not None:
        bad = [i for i, row in enumerate(data_rows) if len(row) != seq]
        if not data_rows or bad:
            raise ValueError(f"data_rows must be non-empty rows of length seq={seq} (rows {bad[:5]} are not)")
    row: dict[str, Any] = {
        "peer": "fsdp2-offload" if offload else "fsdp2", "model": model, "gpus": gpus, "world": world,
        "mbs": mbs, "seq": seq, "steps": steps, "warmup": warmup, "offload": offload,
        "keep_layers": keep_layers, "threads": threads, "lr": lr, "max_grad_norm": max_grad_norm,
    }
    with tempfile.TemporaryDirectory(prefix="slidedp-fsdp2-") as tmp:
        args = dict(row, init_file=os.path.join(tmp, "rendezvous"), out_dir=tmp, data_rows=data_rows)
        args_file = os.path.join(tmp, "args.json")
        with open(args_file, "w", encoding="utf-8") as fh:
            json.dump(args, fh)
        t0 = time.perf_counter()
        codes, timed_out = _launch_and_wait(args_file, world, tmp, timeout_s)
        row["wall_s"] = time.perf_counter() - t0
        reports = [_read_json(os.path.join(tmp, f"rank{r}.json")) for r in range(world)]
        logs = [_tail(os.path.join(tmp, f"rank{r}.log")) for r in range(world)]
    return _row(row, reports, codes, logs, timed_out, timeout_s)


# ---------------------------------------------------------------------------------------------- launcher side
def _rank_env() -> dict[str, str]:
    env = dict(os.environ)
    # the ranks must import this very slidedp, installed or not
    runtime = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = runtime + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for key, value in GPU_ENV.items():
        env.setdefault(key, value)
    return env


def _launch_and_wait(args_file: str, world: int, tmp: str, timeout_s: float) -> tuple[list[int | None], bool]:
    """Start the ranks, wait for all of them; kill the rest once one failed (they wait in a collective forever)."""
    env = _rank_env()
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.log"), "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "slidedp.peers.fsdp2", args_file, str(r), str(world)],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        timed_out = False
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
                break
            if now > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [p.returncode for p in procs], timed_out


def _row(row: dict, reports: list[dict | None], codes: list[int | None], logs: list[str], timed_out: bool,
         timeout_s: float) -> dict:
    if any(r and r.get("status") == "oom" for r in reports):
        return dict(row, error="OOM")
    if timed_out:
        return dict(row, error=f"timed out after {timeout_s:.0f} s; rank 0 log tail:\n{logs[0]}")
    for rank, (rep, code) in enumerate(zip(reports, codes)):
        if code != 0 or rep is None or rep.get("status") != "ok":
            return dict(row, error=f"rank {rank} exited with code {code}:\n{logs[rank]}")
    r0 = reports[0]
    times = r0["times"]
    timed = times[row["warmup"]:] or times
    step_s = statistics.median(timed)
    tokens_per_s = row["mbs"] * row["seq"] * row["world"] / step_s
    row.update(
        threads=r0["threads"], step_s=step_s, times=times, tokens_per_s=tokens_per_s,
        tflops=_flops_per_token(row["model"], row["seq"]) * tokens_per_s / 1e12,
        hbm_peak_gib=r0["hbm_peak_gib"], hbm_peak_gib_ranks=[r["hbm_peak_gib"] for r in reports],
        host_rss_gib=sum(r["rss_gib"] for r in reports),
        host_rss_peak_gib=sum(r["rss_peak_gib"] for r in reports),
        losses=r0["losses"], params=r0["params"],
    )
    if r0.get("grad_norms") is not None:
        row["grad_norms"] = r0["grad_norms"]
    return row


def _flops_per_token(model: str, seq: int) -> float:
    from slidedp.presets import flops_per_token, model_config_dict

    try:
        return flops_per_token(model_config_dict(model), seq)
    except (KeyError, OSError, ValueError):
        return 0.0


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------- rank side
def global_rows(step: int, rank: int, world: int, mbs: int) -> list[int]:
    """Indices of the data rows rank `rank` trains on at `step`: consecutive blocks of mbs, rank-major per step."""
    start = (step * world + rank) * mbs
    return list(range(start, start + mbs))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _proc_status_gib(key: str) -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 2**30
    return 0.0


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


def random_rows(n: int, seq: int, vocab: int):
    """The peer's data when none is given: n rows of seq uniform token ids from a fixed seed (a torch tensor)."""
    import torch

    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(DATA_SEED))


def _init_weights(model, std: float) -> None:
    """Random init as transformers does for these decoders: normal(0, std) matrices, unit norms, zero biases.

    Drawn where the shards live (the GPU, or the host with offload), so the two forms start from different
    random weights on a GPU machine; on the CPU they start from the same.
    """
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)


def _train(a: dict, rank: int, world: int) -> dict:
    from slidedp.config import is_model_path
    from slidedp.presets import PRESETS

    if not is_model_path(a["model"]) and a["model"] not in PRESETS:  # fail before the slow imports
        raise KeyError(f"unknown model preset {a['model']!r}; presets: {', '.join(PRESETS)}")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from slidedp.step.model_adapter import load_hf_config

    cuda = a["gpus"] > 0
    torch.set_num_threads(a["threads"] or max(1, _cores() // world))
    init = f"file://{a['init_file']}"
    if cuda:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    mesh = init_device_mesh(device.type, (world,))

    cfg = load_hf_config(a["model"])  # sdpa attention, no KV cache
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    model.train()
    layers = model.model.layers
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
    _init_weights(model, float(getattr(cfg, "initializer_range", 0.02)))
    # to_empty left the rotary buffers (inv_freq) uninitialised: build them again, on the compute device
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a["lr"], fused=True, **ADAMW)
    params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size

    steps, mbs, seq, clip = a["steps"], a["mbs"], a["seq"], a["max_grad_norm"]
    if a["data_rows"] is not None:
        table = torch.tensor(a["data_rows"], dtype=torch.long)
    else:
        table = random_rows(steps * world * mbs, seq, cfg.vocab_size)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()

    times: list[float] = []
    losses: list = []
    norms: list = []
    for step in range(steps):
        idx = torch.tensor(global_rows(step, rank, world, mbs)) % table.shape[0]
        ids = table.index_select(0, idx).to(device)
        sync()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss  # labels are shifted inside the model
        loss.backward()
        if clip > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach().float())

    # the mean over ranks is the loss of the global batch, as SlideDP reports it (every row has seq tokens)
    mean_loss = torch.stack(losses).to(device)
    dist.all_reduce(mean_loss)
    mean_loss /= world
    grad_norms = None
    if norms:
        grad_norms = [float(n.full_tensor() if hasattr(n, "full_tensor") else n) for n in norms]
    return {
        "threads": torch.get_num_threads(), "times": times, "losses": mean_loss.tolist(), "params": params,
        "grad_norms": grad_norms,
        "hbm_peak_gib": torch.cuda.max_memory_reserved(device) / 2**30 if cuda else 0.0,
        "rss_gib": _proc_status_gib("VmRSS"), "rss_peak_gib": _proc_status_gib("VmHWM"),
    }


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # a failure before torch was imported is no OOM, and need not wait for it
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


def rank_main(args_file: str, rank: int, world: int) -> int:
    """One rank: train, then write rank<r>.json next to the args file (also on failure)."""
    with open(args_file, encoding="utf-8") as fh:
        a = json.load(fh)
    report: dict[str, Any] = {"rank": rank}
    try:
        report.update(_train(a, rank, world), status="ok")
    except Exception as exc:
        traceback.print_exc()
        report.update(status="oom" if _is_oom(exc) else "error", error=f"{type(exc).__name__}: {exc}"[-2000:])
    path = os.path.join(a["out_dir"], f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    if report["status"] != "ok":
        os._exit(1)  # the other ranks may be blocked in a collective: a clean teardown would wait for them
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and not argv[0].startswith("-"):
        return rank_main(argv[0], int(argv[1]), int(argv[2]))
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
    p.add_argument("--threads", type=int, default=None, help="CPU threads per rank (default cores // world)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-grad-norm", type=float, default=0.0, help="> 0: exact global-norm clipping")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are killed")
    args = p.parse_args(argv)
    row = run_fsdp2(args.model, args.gpus, args.mbs, args.seq, args.steps, args.warmup, offload=args.offload,
                    keep_layers=args.keep_layers, threads=args.threads, ranks=args.ranks, lr=args.lr,
                    max_grad_norm=args.max_grad_norm, timeout_s=args.timeout)
    print(json.dumps(row))
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    sys.exit(main())
