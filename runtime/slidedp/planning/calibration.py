"""Calibration: short microbenchmarks of this host at the job's shape, the figures the cost model runs on.

    calib = load_or_calibrate(cfg, topology)        # cached per host and shape; measured on a miss
    python -m slidedp.planning.calibration job.yaml [--quick] [--refresh]

What is measured (docs/interfaces.md §5 has the JSON):
  transfers    H2D and D2H from pinned memory per GPU alone and on all GPUs at once, by chunk size, both
               directions together, and the latency of a tiny copy
  collectives  all-gather and reduce-scatter over the job's GPUs (NCCL over the actual links; with
               NCCL_P2P_DISABLE=1 they cross host memory), or gloo on the CPU
  cpu          fused AdamW and the engine's whole per-unit host update (norm, AdamW, bf16 delivery copy) in
               seconds per 1e9 parameters, and host memory copy bandwidth, by thread count
  host_dram    the host update while every GPU copies both ways: how much host memory they share
  unit         one decoder layer of the job's model (transformers' own class) at the job's (micro-batch, seq):
               forward and backward keeping activations, forward without graph and recompute+backward
               (checkpoint), and the bytes each keeps for backward
  embedding, loss_head   the embedding and the chunked final norm + lm_head + cross-entropy (time per token,
               per chunk, and the peak memory per token of a chunk)
  pinned_alloc_s_per_gib

Medians after warm-up; CUDA timings with events. Never fitted to training runs. On CUDA the measurement runs in a
spawned child so the calling process (the launcher, a web worker) never holds a CUDA context.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch

from slidedp.config import JobConfig
from slidedp.planning.cost_model import UPDATE_DRAM_BYTES
from slidedp.planning.topology import job_gpus, job_interconnect
from slidedp.presets import model_config_dict, unit_param_counts

SCHEMA_VERSION = 1
MIB = 2**20


# ---------------------------------------------------------------------------- public entry points
def calibrate(
    cfg: JobConfig, topology: dict[str, Any], quick: bool = False, collectives: bool = True
) -> dict:
    """Measure everything the cost model needs for this job on this host (in this process)."""
    t_start = time.perf_counter()
    cuda = cfg.gpus > 0
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"the job asks for {cfg.gpus} GPU(s) but CUDA is not available here")
    mc = model_config_dict(cfg.model)
    out = _header(cfg, topology, mc, quick)
    units = unit_param_counts(mc)
    threads_before = torch.get_num_threads()
    try:
        out["cpu"] = _cpu_rates(cfg, topology, max(units), quick, cuda)
        if cuda:
            out["transfers"] = _transfers(cfg.gpus, quick)
            out["pinned_alloc_s_per_gib"] = _pinned_alloc(quick)
            out["host_dram"] = None if quick else _host_dram(cfg, topology)
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        torch.set_num_threads(_compute_threads(cfg, topology))
        dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
        parts = _ModelParts(mc, device, dtype)
        out["unit"] = parts.decoder_layer(cfg.micro_batch_size, cfg.seq_len, reps=3 if quick else 8)
        out["embedding"] = parts.embedding(cfg.micro_batch_size, cfg.seq_len, reps=3 if quick else 8)
        out["loss_head"] = parts.loss_head(
            cfg.policy.loss_chunk_tokens, cfg.micro_batch_size * cfg.seq_len, reps=3 if quick else 6
        )
        del parts
        if cuda:
            torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(threads_before)
    out["collectives"] = None
    if collectives and cfg.world_size > 1:
        out["collectives"] = measure_collectives(
            cfg.world_size, "nccl" if cuda else "gloo", collective_sizes(cuda, quick)
        )
    out["elapsed_s"] = time.perf_counter() - t_start
    return out


def load_or_calibrate(
    cfg: JobConfig,
    topology: dict[str, Any],
    quick: bool = False,
    refresh: bool = False,
    on_log: Callable[[str], None] | None = None,
) -> dict:
    """The cached calibration of this host and job shape, measured (and cached) when missing, stale or quick
    where a full one is asked for. On CUDA the measurement runs in a spawned child process."""
    path = cache_path(cfg, topology)
    if not refresh and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as fh:
                cached = json.load(fh)
            if cached.get("schema") == SCHEMA_VERSION and (quick or not cached.get("quick")):
                return cached
        except (OSError, ValueError):
            pass
    if on_log:
        on_log(
            f"calibrating this host for {cfg.model} at micro-batch {cfg.micro_batch_size} x {cfg.seq_len} "
            f"({'quick' if quick else 'full'}); cached in {path}"
        )
    calib = calibrate_isolated(cfg, topology, quick) if cfg.gpus > 0 else calibrate(cfg, topology, quick)
    save_calibration(calib, path)
    return calib


def calibrate_isolated(cfg: JobConfig, topology: dict[str, Any], quick: bool = False) -> dict:
    """calibrate() in a spawned child, so this process never creates a CUDA context."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(cfg.to_dict(), topology, quick, queue), daemon=False)
    proc.start()
    try:
        status, payload = _collect(queue, [proc], 1, timeout_s=1800)[0]
    finally:
        proc.join(timeout=60)
    if status != "ok":
        raise RuntimeError(f"calibration failed in its child process:\n{payload}")
    return payload


def _collect(queue: Any, procs: list, count: int, timeout_s: float) -> list[tuple[str, Any]]:
    """`count` results from spawned children; a child that dies without answering is an error, not a hang."""
    import queue as queue_mod

    results: list[tuple[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < count:
        try:
            results.append(queue.get(timeout=0.5))
            continue
        except queue_mod.Empty:
            pass
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead or time.monotonic() > deadline:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            why = f"exit code {dead[0].exitcode}" if dead else f"no answer in {timeout_s:.0f} s"
            raise RuntimeError(f"a calibration child process failed ({why})")
    return results


def _child(cfg_dict: dict, topology: dict, quick: bool, queue: Any) -> None:
    import traceback

    try:
        queue.put(("ok", calibrate(JobConfig.from_dict(cfg_dict), topology, quick)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


def merge_collectives(calibration: dict, collectives: dict) -> dict:
    """The calibration with collective figures measured inside the job's ranks (calibrate_collectives)."""
    return {**calibration, "collectives": collectives}


# ---------------------------------------------------------------------------- cache
def cache_dir() -> str:
    return os.environ.get("SLIDEDP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "slidedp", "calibration"
    )


def calibration_key(cfg: JobConfig, topology: dict[str, Any]) -> str:
    """What the figures depend on: the GPUs and links the job uses, the job's shape, and the software."""
    mc = model_config_dict(cfg.model)
    ident = {
        "schema": SCHEMA_VERSION,
        "gpus": [g.get("name") for g in job_gpus(topology, cfg.gpus)],
        "world": cfg.world_size,
        "interconnect": job_interconnect(topology, cfg.gpus) if cfg.gpus else "none",
        "p2p_disabled": bool(topology.get("p2p_disabled")),
        "cores": topology.get("cpu", {}).get("cores"),
        "shape": _shape(cfg, mc),
        "torch": torch.__version__,
    }
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cfg: JobConfig, topology: dict[str, Any]) -> str:
    host = topology.get("hostname") or socket.gethostname()
    return os.path.join(cache_dir(), f"{host}-{calibration_key(cfg, topology)}.json")


def save_calibration(calib: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".calib-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(calib, fh, indent=1)
    os.replace(tmp, path)  # atomic: a reader never sees half a file


# ---------------------------------------------------------------------------- header and shape
def _shape(cfg: JobConfig, mc: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": cfg.model,
        "arch": mc.get("model_type"),
        "micro_batch": cfg.micro_batch_size,
        "seq": cfg.seq_len,
        "hidden": int(mc["hidden_size"]),
        "intermediate": int(mc["intermediate_size"]),
        "heads": int(mc["num_attention_heads"]),
        "kv_heads": int(mc["num_key_value_heads"]),
        "layers": int(mc["num_hidden_layers"]),
        "vocab": int(mc["vocab_size"]),
        "precision": cfg.precision,
    }


def _header(cfg: JobConfig, topology: dict, mc: dict, quick: bool) -> dict[str, Any]:
    gpus = job_gpus(topology, cfg.gpus)
    return {
        "schema": SCHEMA_VERSION,
        "key": calibration_key(cfg, topology),
        "host": topology.get("hostname") or socket.gethostname(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "device": "cuda" if cfg.gpus > 0 else "cpu",
        "gpu_name": gpus[0]["name"] if gpus else None,
        "world": cfg.world_size,
        "p2p_disabled": bool(topology.get("p2p_disabled")),
        "interconnect": job_interconnect(topology, cfg.gpus) if cfg.gpus else "none",
        "software": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
        },
        "shape": _shape(cfg, mc),
    }


def _compute_threads(cfg: JobConfig, topology: dict) -> int:
    cores = int(topology.get("cpu", {}).get("cores") or os.cpu_count() or 1)
    return cfg.cpu_threads or max(1, cores // cfg.world_size)


# ---------------------------------------------------------------------------- timing helpers
def _median_time(fn: Callable[[], Any], reps: int, cuda: bool, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---------------------------------------------------------------------------- host work
def _thread_counts(cfg: JobConfig, topology: dict) -> list[int]:
    cores = int(topology.get("cpu", {}).get("cores") or os.cpu_count() or 1)
    per_rank = _compute_threads(cfg, topology)
    counts = {per_rank, min(cores, per_rank * cfg.world_size), cores, max(1, cores // 4), max(1, cores // 2)}
    return sorted(c for c in counts if c >= 1)


def _cpu_rates(cfg: JobConfig, topology: dict, max_unit: int, quick: bool, cuda: bool) -> dict[str, Any]:
    """Seconds per 1e9 parameters of fused AdamW and of the engine's whole host update, and copy bandwidth
    (bytes read + written per second), by thread count, on buffers larger than the caches."""
    cap = (1 << 24) if quick else (1 << 25)
    n = max(1 << 20, min(cap, max_unit)) if cuda else max(1 << 18, min(1 << 21, max_unit))
    p, g = torch.randn(n), torch.randn(n)
    m, v = torch.zeros(n), torch.zeros(n)
    deliver = torch.empty(n, dtype=torch.bfloat16)
    step = torch.tensor(1.0)
    src, dst = torch.randn(n), torch.empty(n)
    reps = 3 if quick else 5

    def adamw() -> None:
        torch._fused_adamw_(
            [p],
            [g],
            [m],
            [v],
            [],
            [step],
            lr=1e-6,
            beta1=0.9,
            beta2=0.95,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )

    def update() -> None:  # slidedp.step.optimizer: norm of the reduced gradient, AdamW, bf16 delivery copy
        torch.linalg.vector_norm(g, dtype=torch.float64)
        adamw()
        if cfg.precision == "bf16":
            deliver.copy_(p)

    threads = _thread_counts(cfg, topology)
    rows: dict[str, list[float]] = {"adamw_s_per_1e9": [], "update_s_per_1e9": [], "copy_GBps": []}
    for t in threads:
        torch.set_num_threads(t)
        rows["adamw_s_per_1e9"].append(_median_time(adamw, reps, False) * 1e9 / n)
        rows["update_s_per_1e9"].append(_median_time(update, reps, False) * 1e9 / n)
        rows["copy_GBps"].append(2 * 4 * n / _median_time(lambda: dst.copy_(src), reps, False) / 1e9)
    return {"threads": threads, "params": n, **rows}


def _host_dram(cfg: JobConfig, topology: dict) -> dict[str, Any]:
    """The host update alone and while every GPU copies both ways without pause, and the DMA rate alone and
    during the update: host DRAM is one resource for both (capacity = what both move together)."""
    ngpu = cfg.gpus
    threads = min(
        int(topology.get("cpu", {}).get("cores") or 1), _compute_threads(cfg, topology) * cfg.world_size
    )
    torch.set_num_threads(threads)
    n = 1 << 27  # 128 Mi params: 2.5 GiB of state, far beyond the caches
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    deliver = torch.empty(n, dtype=torch.bfloat16)
    step = torch.tensor(1.0)

    def update() -> None:
        torch.linalg.vector_norm(g, dtype=torch.float64)
        torch._fused_adamw_(
            [p],
            [g],
            [m],
            [v],
            [],
            [step],
            lr=1e-6,
            beta1=0.9,
            beta2=0.95,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
        deliver.copy_(p)

    nbuf = 128 * MIB
    host = [torch.empty(nbuf, dtype=torch.uint8, pin_memory=True) for _ in range(2 * ngpu)]
    dev = [torch.empty(nbuf, dtype=torch.uint8, device=f"cuda:{i // 2}") for i in range(2 * ngpu)]
    stop = threading.Event()
    moved = [0] * ngpu

    def dma(i: int) -> None:
        torch.cuda.set_device(i)
        s1, s2 = torch.cuda.Stream(i), torch.cuda.Stream(i)
        while not stop.is_set():
            with torch.cuda.stream(s1):
                dev[2 * i].copy_(host[2 * i], non_blocking=True)
            with torch.cuda.stream(s2):
                host[2 * i + 1].copy_(dev[2 * i + 1], non_blocking=True)
            s1.synchronize()
            s2.synchronize()
            moved[i] += 2 * nbuf

    alone = _median_time(update, 3, False) * 1e9 / n
    workers = [threading.Thread(target=dma, args=(i,), daemon=True) for i in range(ngpu)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    m0, t0 = sum(moved), time.perf_counter()
    time.sleep(1.0)
    dma_alone = (sum(moved) - m0) / (time.perf_counter() - t0) / 1e9
    m0, t0 = sum(moved), time.perf_counter()
    together = _median_time(update, 3, False, warmup=0) * 1e9 / n
    dma_with = (sum(moved) - m0) / (time.perf_counter() - t0) / 1e9
    stop.set()
    for w in workers:
        w.join()
    per_param = UPDATE_DRAM_BYTES[cfg.precision]
    return {
        "threads": threads,
        "update_alone_s_per_1e9": alone,
        "update_with_dma_s_per_1e9": together,
        "dma_alone_GBps": dma_alone,
        "dma_with_update_GBps": dma_with,
        "update_bytes_per_param": per_param,
        "capacity_GBps": per_param / together + dma_with,
    }


# ---------------------------------------------------------------------------- PCIe
def _transfers(ngpu: int, quick: bool) -> dict[str, Any]:
    chunks = [16, 64] if quick else [4, 16, 64, 256]
    total = (64 if quick else 256) * MIB
    hosts = [torch.empty(total, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    devs = [
        [torch.empty(total, dtype=torch.uint8, device=f"cuda:{i}") for _ in range(2)] for i in range(ngpu)
    ]
    streams = [(torch.cuda.Stream(i), torch.cuda.Stream(i)) for i in range(ngpu)]
    reps = 3 if quick else 5

    def copy(direction: str, gpus: list[int], chunk: int) -> float:
        """GB/s per GPU while `gpus` all copy `total` bytes in `chunk`-sized pieces."""

        def run() -> None:
            for i in gpus:
                s = streams[i][0 if direction == "h2d" else 1]
                with torch.cuda.stream(s):
                    for a in range(0, total, chunk):
                        if direction == "h2d":
                            devs[i][0][a : a + chunk].copy_(hosts[0][a : a + chunk], non_blocking=True)
                        else:
                            hosts[1][a : a + chunk].copy_(devs[i][1][a : a + chunk], non_blocking=True)
            for i in gpus:
                streams[i][0 if direction == "h2d" else 1].synchronize()

        run()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        return total / statistics.median(times) / 1e9

    out: dict[str, Any] = {"chunk_mib": chunks}
    for d in ("h2d", "d2h"):
        out[f"{d}_GBps"] = [copy(d, [0], c * MIB) for c in chunks]
        if ngpu > 1:
            out[f"{d}_all_GBps"] = [copy(d, list(range(ngpu)), c * MIB) for c in chunks]
    out["per_gpu"] = [
        {
            "gpu": i,
            "h2d_GBps": copy("h2d", [i], chunks[-1] * MIB),
            "d2h_GBps": copy("d2h", [i], chunks[-1] * MIB),
        }
        for i in range(ngpu)
    ]

    def both() -> None:
        with torch.cuda.stream(streams[0][0]):
            devs[0][0].copy_(hosts[0], non_blocking=True)
        with torch.cuda.stream(streams[0][1]):
            hosts[1].copy_(devs[0][1], non_blocking=True)
        streams[0][0].synchronize()
        streams[0][1].synchronize()

    both()
    t = time.perf_counter()
    for _ in range(reps):
        both()
    out["bidir_GBps"] = 2 * total * reps / (time.perf_counter() - t) / 1e9
    tiny_h, tiny_d = (
        torch.empty(4096, dtype=torch.uint8, pin_memory=True),
        torch.empty(4096, dtype=torch.uint8, device="cuda:0"),
    )

    def tiny() -> None:
        tiny_d.copy_(tiny_h, non_blocking=True)
        torch.cuda.current_stream().synchronize()

    out["latency_s"] = _median_time(tiny, 20, False)
    return out


def _pinned_alloc(quick: bool) -> float:
    nbytes = (64 if quick else 512) * MIB
    t = time.perf_counter()
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dt = time.perf_counter() - t
    del buf
    return dt * 2**30 / nbytes


# ---------------------------------------------------------------------------- collectives
def collective_sizes(cuda: bool, quick: bool) -> list[int]:
    if not cuda:
        return [64 * 1024, 1 * MIB]
    return [4 * MIB, 64 * MIB] if quick else [1 * MIB, 16 * MIB, 128 * MIB, 512 * MIB]


def calibrate_collectives(
    group: Any, device: torch.device, sizes: list[int], reps: int = 5
) -> dict[str, Any]:
    """All-gather (bf16) and reduce-scatter (fp32) of tensors of `sizes` total bytes over `group`, timed inside
    the ranks; every rank returns the slowest rank's medians."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    cuda = device.type == "cuda"
    out: dict[str, Any] = {
        "backend": dist.get_backend(group),
        "world": world,
        "all_gather": [],
        "reduce_scatter": [],
    }
    for nbytes in sizes:
        for op, dtype in (("all_gather", torch.bfloat16), ("reduce_scatter", torch.float32)):
            esize = torch.empty((), dtype=dtype).element_size()
            numel = max(world, nbytes // esize // world * world)
            full = torch.ones(numel, dtype=dtype, device=device)
            part = torch.ones(numel // world, dtype=dtype, device=device)

            def run(op: str = op, full: torch.Tensor = full, part: torch.Tensor = part) -> None:
                if op == "all_gather":
                    dist.all_gather_into_tensor(full, part, group=group)
                else:
                    dist.reduce_scatter_tensor(part, full, group=group)

            dist.barrier(group=group)
            with (
                warnings.catch_warnings()
            ):  # newer torch renames these collectives; the GPU machine's does not
                warnings.simplefilter("ignore", FutureWarning)
                t = torch.tensor(
                    [_median_time(run, reps, cuda, warmup=2)], dtype=torch.float64, device=device
                )
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            out[op].append({"bytes": numel * esize, "s": float(t.item())})
    return out


def measure_collectives(world: int, backend: str, sizes: list[int]) -> dict[str, Any]:
    """Spawn `world` ranks (file:// rendezvous, loopback only) and run calibrate_collectives in them."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="slidedp-calib-") as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_collective_rank, args=(r, world, backend, init, sizes, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        try:
            results = _collect(queue, procs, world, timeout_s=600)
        finally:
            for p in procs:
                p.join(timeout=60)
    bad = [r[1] for r in results if r[0] != "ok"]
    if bad:
        raise RuntimeError("collective calibration failed:\n" + bad[0])
    return next(r[1] for r in results if r[1].get("rank") == 0)


def _collective_rank(rank: int, world: int, backend: str, init: str, sizes: list[int], queue: Any) -> None:
    import traceback

    import torch.distributed as dist

    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world,
            **({"device_id": device} if backend == "nccl" else {}),
        )
        try:
            res = calibrate_collectives(dist.group.WORLD, device, sizes)
        finally:
            dist.destroy_process_group()
        queue.put(("ok", {**res, "rank": rank}))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------- the model's parts
class _ModelParts:
    """One decoder layer, the rotary embedding, the embedding and the loss head of the job's architecture,
    built with transformers' own classes from the HF config (random weights; nothing is downloaded)."""

    def __init__(self, mc: dict[str, Any], device: torch.device, dtype: torch.dtype):
        import transformers

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        kw = {
            k: v
            for k, v in mc.items()
            if k
            not in ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map")
        }
        kw["num_hidden_layers"] = 1
        config = transformers.AutoConfig.for_model(mc["model_type"], **kw)
        config._attn_implementation = "sdpa"
        self.config, self.device, self.dtype = config, device, dtype
        with torch.device("meta"):  # only to learn the architecture's classes
            skeleton = transformers.AutoModelForCausalLM.from_config(config)
        self.layer_cls = type(skeleton.model.layers[0])
        self.rotary_cls = type(skeleton.model.rotary_emb)
        self.norm_cls = type(skeleton.model.norm)
        self.cuda = device.type == "cuda"
        del skeleton

    def _inputs(self, mb: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        x = torch.randn(mb, seq, self.config.hidden_size, device=self.device, dtype=self.dtype) * 0.02
        pos = torch.arange(seq, device=self.device)[None].expand(mb, -1)
        rotary = self.rotary_cls(self.config).to(self.device)
        return x, pos, rotary(x, pos)

    def decoder_layer(self, mb: int, seq: int, reps: int) -> dict[str, Any]:
        layer = self.layer_cls(self.config, layer_idx=0).to(device=self.device, dtype=self.dtype)
        x, pos, pe = self._inputs(mb, seq)
        grad = torch.randn_like(x) * 1e-3

        def fwd_graph() -> torch.Tensor:
            h = x.detach().requires_grad_(True)
            out = layer(h, position_ids=pos, position_embeddings=pe)
            return out[0] if isinstance(out, tuple) else out

        state: dict[str, Any] = {}

        def keep_fwd() -> None:
            state["out"] = fwd_graph()

        def keep_bwd() -> None:
            state.pop("out").backward(grad)

        def ckpt_fwd() -> None:
            with torch.no_grad():
                fwd_graph()

        def ckpt_bwd() -> None:  # recompute with a graph, then backward (slidedp.step.engine)
            fwd_graph().backward(grad)

        fwd_keep = self._alternating(keep_fwd, keep_bwd, reps)
        fwd_ckpt = _median_time(ckpt_fwd, reps, self.cuda)
        bwd_ckpt = _median_time(ckpt_bwd, reps, self.cuda)
        saved = self._saved_bytes(fwd_graph, [p.untyped_storage().data_ptr() for p in layer.parameters()])
        return {
            "params": sum(p.numel() for p in layer.parameters()),
            "micro_batch": mb,
            "seq": seq,
            "tokens": mb * seq,
            "fwd_keep_s": fwd_keep[0],
            "bwd_keep_s": fwd_keep[1],
            "fwd_checkpoint_s": fwd_ckpt,
            "bwd_checkpoint_s": bwd_ckpt,
            "saved_keep_bytes": saved,
            "saved_checkpoint_bytes": x.numel() * x.element_size(),  # the layer's input, recomputed from
            "saved_source": "saved-tensor hooks (parameters excluded)",
        }

    def _alternating(
        self, first: Callable[[], None], second: Callable[[], None], reps: int
    ) -> tuple[float, float]:
        """Median times of first() and second(), run as pairs (the backward needs its forward)."""
        first()
        second()
        a_times, b_times = [], []
        for _ in range(reps):
            for fn, times in ((first, a_times), (second, b_times)):
                times.append(_median_time(fn, 1, self.cuda, warmup=0))
        return statistics.median(a_times), statistics.median(b_times)

    def _saved_bytes(self, fwd: Callable[[], torch.Tensor], param_ptrs: list[int]) -> int:
        """Bytes autograd keeps for backward (each storage once), parameters excluded: the window holds those."""
        seen: dict[int, int] = {}
        params = set(param_ptrs)

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fwd()
        del out
        return int(sum(seen.values()))

    def embedding(self, mb: int, seq: int, reps: int) -> dict[str, float]:
        V, H = self.config.vocab_size, self.config.hidden_size
        w = torch.randn(V, H, device=self.device, dtype=self.dtype) * 0.02
        ids = torch.randint(0, V, (mb * seq,), device=self.device)
        g = torch.randn(mb * seq, H, device=self.device, dtype=self.dtype)
        acc = torch.zeros(V, H, device=self.device, dtype=torch.float32)
        fwd = _median_time(lambda: torch.nn.functional.embedding(ids, w), reps, self.cuda)
        bwd = _median_time(lambda: acc.index_add_(0, ids, g.float()), reps, self.cuda)
        return {"fwd_s": fwd, "bwd_s": bwd}

    def loss_head(self, chunk: int, tokens: int, reps: int) -> dict[str, Any]:
        """Final norm + lm_head + fp32 cross-entropy, forward and backward, on one chunk at two chunk sizes:
        time = tokens * s_per_token + chunks * s_per_chunk; peak = fixed + tokens_in_chunk * per_token."""
        import torch.nn.functional as F

        V, H = self.config.vocab_size, self.config.hidden_size
        norm = self.norm_cls(H, eps=getattr(self.config, "rms_norm_eps", 1e-6)).to(self.device, self.dtype)
        w = (torch.randn(V, H, device=self.device, dtype=self.dtype) * 0.02).requires_grad_(True)
        sizes = sorted({max(1, min(chunk, tokens) // 2), max(1, min(chunk, tokens))})
        times, peaks = [], []
        for c in sizes:
            x = torch.randn(c, H, device=self.device, dtype=self.dtype).requires_grad_(True)
            tgt = torch.randint(0, V, (c,), device=self.device)

            def step(x: torch.Tensor = x, tgt: torch.Tensor = tgt) -> None:
                logits = F.linear(norm(x), w).float()
                F.cross_entropy(logits, tgt, reduction="sum").backward()
                w.grad = None
                x.grad = None

            times.append(_median_time(step, reps, self.cuda))
            if self.cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                step()
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated(self.device) - base)
        if len(sizes) == 2:
            per_tok = max(0.0, (times[1] - times[0]) / (sizes[1] - sizes[0]))
            per_chunk = max(0.0, times[1] - per_tok * sizes[1])
        else:
            per_tok, per_chunk = times[0] / sizes[0], 0.0
        out: dict[str, Any] = {
            "chunk_tokens": sizes,
            "s": times,
            "s_per_token": per_tok,
            "s_per_chunk": per_chunk,
        }
        if len(peaks) == 2:
            per_tok_b = max(0.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
            out.update(
                peak_bytes=peaks,
                peak_bytes_per_token=per_tok_b,
                peak_fixed_bytes=max(0.0, peaks[1] - per_tok_b * sizes[1]),
            )
        return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    from slidedp.config import load_config_file
    from slidedp.planning.topology import detect

    ap = argparse.ArgumentParser(description="Calibrate this host for a job (cached) and print the JSON.")
    ap.add_argument("config")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--refresh", action="store_true")
    args = ap.parse_args(argv)
    cfg = JobConfig.from_dict(load_config_file(args.config))
    topo = detect(cfg.host_ram_gib)
    print(
        json.dumps(
            load_or_calibrate(
                cfg, topo, quick=args.quick, refresh=args.refresh, on_log=lambda s: print(s, file=sys.stderr)
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
