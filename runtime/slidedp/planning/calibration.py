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
  update_in_step  the host update unit by unit on cold buffers in a thread of its own, alone and while this
               thread issues a decoder layer's forward and backward, as the engine's issuing thread does
  unit         one decoder layer of the job's model (transformers' own class) at the job's (micro-batch, seq):
               forward and backward keeping activations, forward without graph and recompute+backward
               (checkpoint), and the bytes each keeps for backward
  delivery_cast  on CUDA with bf16: one decoder layer's delivery with the cast on the GPU (the engine's Routes),
               alone and beside the layer's forward, by transfer chunk and through the cast scratch
  unit_compiled  on CUDA, the same figures for the layer through the engine's compiled layer
               (policy.compiled_layers), with the compile's first-call seconds and graph counts
  embedding, loss_head   the embedding and the chunked final norm + lm_head + cross-entropy (time per token,
               per chunk, and the peak memory per token of a chunk)
  pinned_alloc_s_per_gib

A CPU job (gpus 0) measures what its step runs and no more: `cpu` at its own thread counts, the model's parts at
its rank's thread count (each figure with reps only while they move its median), and gloo collectives with
several ranks (docs/planning.md, "CPU hosts").

The measurements live in microbench.py (host and links) and model_bench.py (the model's parts); this module
runs them, times the collectives in rank processes and caches the result. Medians after warm-up; CUDA timings
with events. Never fitted to training runs. On CUDA the measurement runs in a process of its own (slidedp.ranks,
as the ranks of a job) so the calling process (the launcher, a web worker) never holds a CUDA context.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch

from slidedp import atomic_file
from slidedp.cache_paths import calibration_dir
from slidedp.config import JobConfig
from slidedp.planning.host_identity import host_digest, measured_on
from slidedp.planning.microbench import (
    MIB,
    compute_threads,
    cpu_rates,
    delivery_cast,
    device_update,
    host_dram,
    median_time,
    pinned_alloc,
    transfers,
    update_in_step,
)
from slidedp.planning.model_bench import ModelParts
from slidedp.planning.shape import SCHEMA_VERSION, calibration_shape
from slidedp.planning.topology import job_gpus, job_interconnect
from slidedp.presets import model_config_dict, unit_param_counts
from slidedp.ranks import Launch, RankFailed
from slidedp.step.collectives import all_gather, reduce_scatter
from slidedp.version import __version__ as slidedp_version

# 2: the host update is timed as the engine runs it (AdamW and the bf16 cast, no norm pass) and host_dram's DMA
# threads no longer spin a core during the update; calibrations of version 1 are measured again.
# 3: device_update (the device-side AdamW of units updated on the GPUs), without which AutoPolicy cannot time them.
# 4: the host update is timed on buffers mapped as the host state is (shared files in /dev/shm), not on private
# memory that the kernel may back with huge pages: the engine's update ran ~20% slower than version 3 said.
# 5: update_in_step, the host update beside a thread issuing a decoder layer's forward and backward, unit by unit
# on cold buffers: the updater ran 20-40% slower in steps than the `cpu` rates alone.
# 6: unit_compiled, the decoder layer through the engine's compiled layer (policy.compiled_layers) on CUDA, without
# which AutoPolicy cannot price compiled layers.
# 7: delivery_cast, a decoder layer's delivery with the bf16 cast on the GPU alone and beside the layer's forward,
# by transfer chunk and through the cast scratch: beside a layer's GEMMs it ran below the link's rate.
# (SCHEMA_VERSION lives in shape.py, which the API reads without torch.)


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
        out["cpu"] = cpu_rates(cfg, topology, max(units), quick, cuda)
        if cuda:
            out["transfers"] = transfers(cfg.gpus, quick)
            out["pinned_alloc_s_per_gib"] = pinned_alloc(quick)
            out["host_dram"] = None if quick else host_dram(cfg, topology)
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        torch.set_num_threads(compute_threads(cfg, topology))
        dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
        if cuda:
            out["device_update"] = device_update(device, dtype, quick)
        parts = ModelParts(mc, device, dtype)
        out["unit"] = parts.decoder_layer(cfg.micro_batch_size, cfg.seq_len, reps=3 if quick else 8)
        if cuda:
            out["unit_compiled"] = compiled_unit(parts, cfg, reps=3 if quick else 8)
        if cuda and dtype == torch.bfloat16 and not quick:
            out["delivery_cast"] = measured_cast(parts, cfg, device)
        out["embedding"] = parts.embedding(cfg.micro_batch_size, cfg.seq_len, reps=3 if quick else 8)
        out["loss_head"] = parts.loss_head(
            cfg.policy.loss_chunk_tokens, cfg.micro_batch_size * cfg.seq_len, reps=3 if quick else 6
        )
        if cuda and not quick:
            out["update_in_step"] = update_in_step(
                cfg, topology, max(units), parts.issue_loop(cfg.micro_batch_size, cfg.seq_len),
                "a decoder layer's forward and backward issued from Python",
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


def measured_cast(parts: ModelParts, cfg: JobConfig, device: torch.device) -> dict[str, Any]:
    """The delivery cast beside the layer's forward (microbench.delivery_cast), or why it could not be measured:
    the plan then charges a GPU-cast delivery the link's rate, as without the figure, and the job still plans."""
    try:
        calls = parts.layer_calls(cfg.micro_batch_size, cfg.seq_len)
        return delivery_cast(device, calls.params, calls.ckpt_fwd)
    except Exception as exc:  # noqa: BLE001 - a figure the plan can do without never stops the calibration
        torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def compiled_unit(parts: ModelParts, cfg: JobConfig, reps: int) -> dict[str, Any]:
    """The decoder layer under policy.compiled_layers, or why it could not be measured: a compile that fails here
    (no compiler for this GPU, a graph inductor cannot build) is recorded, and the planner then never chooses
    compiled layers and says why (planning/compiled_choice.py)."""
    try:
        return parts.compiled_layer(cfg.micro_batch_size, cfg.seq_len, reps)
    except Exception as exc:  # any failure of the compile stack: the record keeps its text
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first[:300]}"}


def load_or_calibrate(
    cfg: JobConfig,
    topology: dict[str, Any],
    quick: bool = False,
    refresh: bool = False,
    on_log: Callable[[str], None] | None = None,
) -> dict:
    """The cached calibration of this host and job shape, measured (and cached) when missing, stale or quick
    where a full one is asked for. On CUDA the measurement runs in a process of its own."""
    path = cache_path(cfg, topology)
    if not refresh and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as fh:
                cached = json.load(fh)
            # a record another machine measured (a copied or shared cache) is measured again here
            if (cached.get("schema") == SCHEMA_VERSION and (quick or not cached.get("quick"))
                    and measured_on(cached, topology)):
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
    """calibrate() in a rank process of its own (slidedp.ranks), so this process never creates a CUDA context."""
    with Launch("slidedp.planning.calibration:calibrate_rank", 1, prefix="slidedp-calib-") as ranks:
        ranks.start({"config": cfg, "topology": topology, "quick": quick})
        try:
            return ranks.results(timeout_s=1800)[0]
        except RankFailed as exc:
            raise RuntimeError(f"calibration failed in its own process: {exc}") from None


def calibrate_rank(args: dict, link: Any) -> dict:
    return calibrate(args["config"], args["topology"], args["quick"])


def merge_collectives(calibration: dict, collectives: dict) -> dict:
    """The calibration with collective figures measured inside the job's ranks (calibrate_collectives)."""
    return {**calibration, "collectives": collectives}


# ---------------------------------------------------------------------------- cache
def cache_dir() -> str:
    return calibration_dir()


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
        "shape": calibration_shape(cfg, mc),
        "torch": torch.__version__,
    }
    if not cfg.gpus:
        # A CPU job's model parts and host rates are timed at its rank's thread count (cpu_threads, else the
        # cores over the ranks): a job that sets another count is measured again. GPU keys stay as they were.
        ident["threads"] = compute_threads(cfg, topology)
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cfg: JobConfig, topology: dict[str, Any]) -> str:
    host = topology.get("hostname") or socket.gethostname()
    return os.path.join(cache_dir(), f"{host}-{calibration_key(cfg, topology)}.json")


def cached_calibrations(hostname: str | None = None) -> list[dict]:
    """Every calibration record cached for this host (one per job shape measured), oldest file name first; a file
    that does not read as JSON is left out. What `slidedp topology --save` puts in a saved host."""
    directory = cache_dir()
    prefix = f"{hostname or socket.gethostname()}-"
    if not os.path.isdir(directory):
        return []
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(prefix) and name.endswith(".json"):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as fh:
                    record = json.load(fh)
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def save_calibration(calib: dict, path: str) -> None:
    atomic_file.write_json(path, calib)


# ---------------------------------------------------------------------------- header and shape
def _header(cfg: JobConfig, topology: dict, mc: dict, quick: bool) -> dict[str, Any]:
    gpus = job_gpus(topology, cfg.gpus)
    return {
        "schema": SCHEMA_VERSION,
        "key": calibration_key(cfg, topology),
        "host": topology.get("hostname") or socket.gethostname(),
        "host_digest": host_digest(topology),  # the hardware it was measured on (host_identity.py)
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
            "slidedp": slidedp_version,
        },
        "shape": calibration_shape(cfg, mc),
    }


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
                    all_gather(full, part, group=group)
                else:
                    reduce_scatter(part, full, group=group)

            dist.barrier(group=group)
            t = torch.tensor([median_time(run, reps, cuda, warmup=2)], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            out[op].append({"bytes": numel * esize, "s": float(t.item())})
    return out


def measure_collectives(world: int, backend: str, sizes: list[int]) -> dict[str, Any]:
    """Start `world` ranks (slidedp.ranks: file:// rendezvous, loopback only) and run calibrate_collectives in
    them; rank 0's figures."""
    with Launch("slidedp.planning.calibration:collective_rank", world, prefix="slidedp-calib-") as ranks:
        ranks.start({"backend": backend, "sizes": sizes})
        try:
            return ranks.results(timeout_s=600)[0]
        except RankFailed as exc:
            raise RuntimeError(f"collective calibration failed: {exc}") from None


def collective_rank(args: dict, link: Any) -> dict:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = link.join(args["backend"] == "nccl").device
    try:
        res = calibrate_collectives(dist.group.WORLD, device, args["sizes"])
    finally:
        dist.destroy_process_group()
    return {**res, "rank": link.rank}


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
