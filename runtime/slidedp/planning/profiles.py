"""Declared hosts: plan a job for a machine described in a profile instead of the one it runs on.

A profile (runtime/slidedp/assets/profiles/*.json, or a user's own file) declares a host's headline figures: its
GPUs (count, name, memory, memory bandwidth, dense BF16 tensor TFLOPS, PCIe generation and width, peer-to-peer)
and its host (RAM, logical CPUs, DRAM bandwidth), each with a note on where the figure comes from.

    profile = load("1x-rtx4090-128g")                 # a shipped profile's name, or a path to a JSON file
    topo = declared_topology(profile)                  # the shape topology.detect() returns, marked "declared"
    calib = declared_calibration(cfg, profile)         # the figures the cost model reads, none of them measured
    plan = plan_job(cfg, topo, calib)                  # AutoPolicy, as for this host

The calibration record says of every figure whether it is declared (taken from the profile) or derived (computed
from declared figures under one of the efficiency assumptions below); nothing in it is measured. The assumptions
come from what our H200 development machine measured against its own datasheet figures (tests pin the
derivation against that machine's calibration), not from measurements on the declared cards. Imports no torch:
the web API plans with it. docs/planning.md, "Declared hosts (profiles)", explains the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import resources
from typing import Any

from slidedp.planning.job import GIB, UPDATE_DRAM_BYTES, Job
from slidedp.planning.shape import SCHEMA_VERSION, calibration_shape

# ---------------------------------------------------------------------------- efficiency assumptions
# Share of the dense BF16 tensor peak a decoder layer's and the loss head's matmuls reach: our H200 ran a Qwen3-1.7B
# layer at 16k tokens at about 0.45 of its peak in the matmuls; we assume one figure for every card.
MATMUL_EFFICIENCY = 0.5
# Share of that peak the attention kernel (SDPA, causal) reaches: attention runs below the plain matmuls.
ATTENTION_EFFICIENCY = 0.4
# Backward FLOPs over forward FLOPs: twice for matmuls (input and weight gradients); flash attention's backward also
# recomputes the scores.
MATMUL_BACKWARD_RATIO = 2.0
ATTENTION_BACKWARD_RATIO = 2.5
# Share of the memory bandwidth elementwise kernels and the device AdamW reach (our H200's device AdamW: 0.67).
HBM_EFFICIENCY = 0.7
# Bytes an elementwise pass moves per byte a decoder layer saves for backward: forward writes what it saves and the
# next kernel reads it; backward reads it and writes gradients of the same size, twice over.
FORWARD_BYTES_PER_SAVED_BYTE = 2.0
BACKWARD_BYTES_PER_SAVED_BYTE = 4.0
# Bytes per value of the embedding's backward (index_add of fp32 gradients): on our H200 it took 2.5x its plain byte
# count (a read of the bf16 gradient, its fp32 copy, the accumulator read and written).
EMBEDDING_BWD_BYTES_PER_VALUE = 36.0
# GPU-side AdamW with the bf16 cast: reads param, grad, m, v (fp32), writes param, m, v and the bf16 copy.
DEVICE_UPDATE_BYTES = 30
# Share of a PCIe link's per-direction rate a pinned copy reaches (our H200's Gen5 x16: 53 of 63 GB/s).
PCIE_COPY_EFFICIENCY = 0.82
# Both directions at once, over twice one direction (our H200: 85.5 of 2 x 52 GB/s).
PCIE_BIDIR_FRACTION = 0.8
# Cost of each chunk of a chunked copy and of a tiny copy's round trip (our H200: ~3 us per chunk, 23 us).
COPY_CHUNK_OVERHEAD_S = 3e-6
COPY_LATENCY_S = 20e-6
# Share of the host's DRAM peak its memory-bound work (STREAM-like copies, the host update, DMA) reaches together.
DRAM_EFFICIENCY = 0.7
# What one logical CPU does where DRAM does not bind (our H200 host's Xeon: 0.27e9 params/s of the host update and
# 0.37e9 of AdamW alone per thread at 4 threads, 9 GB/s of copy).
UPDATE_PARAMS_PER_S_PER_THREAD = 0.25e9
ADAMW_PARAMS_PER_S_PER_THREAD = 0.35e9
COPY_GBPS_PER_THREAD = 9.0
# The host update in a step, beside the thread issuing the GPU's work, over the update alone (calibration
# update_in_step: 1.13 on our H200 host; 1.2-1.4 in earlier runs).
UPDATE_IN_STEP_FACTOR = 1.2
# Collectives: bus bandwidth as a share of one direction of a PCIe copy. Without peer-to-peer NCCL stages through
# host memory (our H200 pair with P2P off: 26.5 of 53 GB/s); with P2P over PCIe an assumption.
COLLECTIVE_VIA_HOST_FRACTION = 0.5
COLLECTIVE_P2P_FRACTION = 0.8
COLLECTIVE_LATENCY_S = 50e-6
# Sizes the collective table is given at, as calibration measures them.
COLLECTIVE_SIZES = (1 << 20, 16 << 20, 128 << 20, 512 << 20)
CHUNK_MIB = (4, 16, 64, 256)

# GB/s per lane and direction of each PCIe generation (after line encoding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
SHOWN_CHARS = 80  # what an error quotes of a profile name it was given (a request may send 100 KB of one)
# Field -> (type, lower bound exclusive or inclusive, upper bound) of each figure a profile declares.
GPU_FIELDS: dict[str, tuple[type, float, float]] = {
    "count": (int, 1, 64),
    "hbm_gib": (float, 1, 4096),
    "hbm_gbps": (float, 10, 100_000),
    "bf16_dense_tflops": (float, 1, 100_000),
    "pcie_gen": (int, 1, 6),
    "pcie_width": (int, 1, 16),
}
HOST_FIELDS: dict[str, tuple[type, float, float]] = {
    "ram_gib": (float, 1, 1 << 20),
    "cores": (int, 1, 4096),
    "dram_gbps": (float, 1, 100_000),
}
FIGURES = [f"gpus.{k}" for k in (*GPU_FIELDS, "p2p") if k != "count"] + [f"host.{k}" for k in HOST_FIELDS]


class ProfileError(ValueError):
    """A profile that cannot be used: names every bad or missing field and what to give instead."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        super().__init__(f"profile {source}: " + "; ".join(problems))


# ---------------------------------------------------------------------------- loading
def profile_dir() -> str:
    return str(resources.files("slidedp") / "assets" / "profiles")


def shipped() -> list[str]:
    """Names of the profiles shipped with the package, sorted."""
    try:
        files = os.listdir(profile_dir())
    except OSError:
        return []
    return sorted(f[: -len(".json")] for f in files if f.endswith(".json"))


def load(name_or_path: str, allow_path: bool = True) -> dict[str, Any]:
    """A shipped profile by name or (allow_path) a profile file, validated; ProfileError says what is wrong.

    The web API passes allow_path=False: it never reads a path a request names."""
    quoted = repr(name_or_path if len(name_or_path) <= SHOWN_CHARS else name_or_path[:SHOWN_CHARS] + "…")
    if name_or_path in shipped():
        return _read(os.path.join(profile_dir(), name_or_path + ".json"), name_or_path)
    names = ", ".join(shipped())
    if not allow_path:
        raise ProfileError(quoted, [f"no shipped profile has this name; the shipped ones: {names}"])
    if not os.path.isfile(name_or_path):
        raise ProfileError(
            quoted,
            [f"is neither a shipped profile ({names}) nor a file; give one of those names or the path of a profile "
             "JSON file (docs/interfaces.md, 'Hardware profile JSON')"],
        )
    return _read(name_or_path, None)


def _read(path: str, expect_name: str | None) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ProfileError(path, [f"cannot be read as JSON ({exc})"]) from None
    profile = validate(raw, path)
    if expect_name is not None and profile["name"] != expect_name:
        raise ProfileError(path, [f"name: is {profile['name']!r}, the file is named {expect_name!r}.json"])
    profile["source"] = "shipped" if expect_name is not None else os.path.abspath(path)
    return profile


def validate(raw: Any, source: str = "profile") -> dict[str, Any]:
    """The profile with its figures as numbers, or ProfileError naming every field that is missing or wrong."""
    if not isinstance(raw, dict):
        raise ProfileError(source, [f"must be a JSON object, got {type(raw).__name__}"])
    problems: list[str] = []
    name, desc = raw.get("name"), raw.get("description")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append("name: missing or not a short lower-case name (letters, digits, '-' and '.'), e.g. "
                        "'my-2x-4090'")
    if not isinstance(desc, str) or not desc.strip():
        problems.append("description: missing; say in a line what the host is, e.g. '1x RTX 4090, 128 GB'")
    out: dict[str, Any] = {"name": name, "description": desc}
    for section, fields in (("gpus", GPU_FIELDS), ("host", HOST_FIELDS)):
        node = raw.get(section)
        if not isinstance(node, dict):
            problems.append(f"{section}: missing; an object with {', '.join(fields)}"
                            + (", name and p2p" if section == "gpus" else ""))
            continue
        got: dict[str, Any] = {}
        for key, (kind, lo, hi) in fields.items():
            value = node.get(key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and kind is int and value != int(value):
                ok = False
            if not ok or not lo <= value <= hi:
                what = "a whole number" if kind is int else "a number"
                problems.append(f"{section}.{key}: {'missing' if value is None else f'{value!r} is not usable'}; "
                                f"give {what} from {lo:g} to {hi:g}")
                continue
            got[key] = kind(value)
        if section == "gpus":
            if not isinstance(node.get("name"), str) or not node["name"].strip():
                problems.append("gpus.name: missing; the GPU's name as nvidia-smi prints it, e.g. "
                                "'NVIDIA GeForce RTX 4090'")
            if not isinstance(node.get("p2p"), bool):
                problems.append("gpus.p2p: missing; true when the GPUs exchange data directly over PCIe, false "
                                "when collectives go through host memory (GeForce cards: false)")
            got.update(name=node.get("name"), p2p=node.get("p2p"))
        unknown = sorted(set(node) - set(fields) - {"name", "p2p"})
        if unknown:
            problems.append(f"{section}: unknown field(s) {', '.join(unknown)}; the fields are "
                            f"{', '.join(fields)}" + (", name, p2p" if section == "gpus" else ""))
        out[section] = got
    sources = raw.get("sources")
    if not isinstance(sources, dict):
        problems.append("sources: missing; an object with a note per figure (" + ", ".join(FIGURES) + ") saying "
                        "where it comes from (a datasheet, a measurement, or 'assumed: ...')")
    else:
        lacking = [f for f in FIGURES if not isinstance(sources.get(f), str) or not sources[f].strip()]
        if lacking:
            problems.append(f"sources: no note for {', '.join(lacking)}; say where each figure comes from")
        out["sources"] = dict(sources)
    unknown = sorted(set(raw) - {"name", "description", "gpus", "host", "sources"})
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)}; a profile has name, description, gpus, host, sources")
    if problems:
        raise ProfileError(source, problems)
    return out


def summary(profile: dict[str, Any]) -> dict[str, Any]:
    """A profile's headline figures, for lists (GET /api/profiles, slidedp plan --profiles)."""
    g, h = profile["gpus"], profile["host"]
    return {
        "name": profile["name"],
        "description": profile["description"],
        "gpus": g["count"],
        "gpu_name": g["name"],
        "gpu_memory_gib": g["hbm_gib"],
        "bf16_dense_tflops": g["bf16_dense_tflops"],
        "pcie": f"Gen{g['pcie_gen']} x{g['pcie_width']}",
        "p2p": g["p2p"],
        "host_ram_gib": h["ram_gib"],
        "cores": h["cores"],
        "dram_gbps": h["dram_gbps"],
    }


def job_errors(cfg: Any, profile: dict[str, Any]) -> list[dict[str, str]]:
    """What keeps a job from being planned on the declared host, as config errors ({"loc", "msg"})."""
    errors = []
    if cfg.gpus <= 0:
        errors.append({"loc": "gpus", "msg": f"is 0 (a CPU job); the declared host {profile['name']} is a GPU host: "
                       "set gpus, or plan a CPU job for this machine without a profile"})
    ram = profile["host"]["ram_gib"]
    if cfg.host_ram_gib is not None and cfg.host_ram_gib > ram:
        errors.append({"loc": "host_ram_gib", "msg": f"{cfg.host_ram_gib:g} GiB is more than the {ram:g} GiB the "
                       f"declared host {profile['name']} has; give at most {ram:g}, or leave it out"})
    return errors


def format_list(names: list[str] | None = None) -> str:
    """The shipped profiles as a table (slidedp profiles)."""
    rows = [summary(load(n)) for n in (names if names is not None else shipped())]
    out = [f"{'name':<20}{'GPUs':>5}  {'GPU':<26}{'GiB':>5}{'TFLOPS':>8}  {'PCIe':<9}{'P2P':<5}{'RAM GiB':>8}"
           f"{'CPUs':>6}{'DRAM GB/s':>11}"]
    for r in rows:
        out.append(f"{r['name']:<20}{r['gpus']:>5}  {r['gpu_name']:<26}{r['gpu_memory_gib']:>5g}"
                   f"{r['bf16_dense_tflops']:>8g}  {r['pcie']:<9}{'yes' if r['p2p'] else 'no':<5}"
                   f"{r['host_ram_gib']:>8g}{r['cores']:>6}{r['dram_gbps']:>11g}")
    out.append("")
    out.append("TFLOPS: dense BF16 tensor peak. Plan a job for one: slidedp plan --config JOB.yaml --profile NAME "
               "(or the path of a profile JSON file of your own).")
    return "\n".join(out)


# ---------------------------------------------------------------------------- topology
def declared_topology(profile: dict[str, Any]) -> dict[str, Any]:
    """The topology (docs/interfaces.md §4, as topology.detect() returns it) of the declared host, with
    "declared": {"profile", "description", "source"} saying it was not detected."""
    g, h = profile["gpus"], profile["host"]
    ram = int(h["ram_gib"] * GIB)
    pcie = {"gen": g["pcie_gen"], "width": g["pcie_width"], "max_gen": g["pcie_gen"], "max_width": g["pcie_width"],
            "source": "declared"}
    gpus = [
        {"index": i, "physical_index": i, "uuid": None, "name": g["name"], "hbm_bytes": int(g["hbm_gib"] * GIB),
         "bus_id": None, "pcie": dict(pcie), "numa_node": None}
        for i in range(g["count"])
    ]
    links = [
        {"a": a, "b": b, "kind": "pcie", "p2p": g["p2p"], "detail": "declared", "hardware": "pcie"}
        for a in range(g["count"]) for b in range(a + 1, g["count"])
    ]
    return {
        "schema": 1,
        "hostname": "declared:" + profile["name"],
        "gpus": gpus,
        "gpu_source": "declared",
        "links": links,
        "p2p_disabled": False,
        "cpu": {"cores": h["cores"], "logical_cpus": h["cores"], "quota_cores": None, "model": None, "numa_nodes": 1},
        "host_ram": {"limit_bytes": ram, "source": "declared", "memtotal_bytes": ram},
        "shm": {"path": "/dev/shm", "free_bytes": ram // 2, "total_bytes": ram // 2},  # Linux mounts half of RAM
        "software": {"python": None, "torch": None, "cuda": None, "nccl": None, "transformers": None},
        "notes": [f"declared host ({profile['name']}): {profile['description']}; not detected"],
        "declared": declared_marker(profile),
    }


def declared_marker(profile: dict[str, Any]) -> dict[str, Any]:
    return {"profile": profile["name"], "description": profile["description"],
            "source": profile.get("source", "shipped")}


# ---------------------------------------------------------------------------- calibration
def declared_calibration(cfg: Any, profile: dict[str, Any], model_cfg: dict[str, Any] | None = None) -> dict:
    """A calibration record (docs/interfaces.md §5) of the job's shape on the declared host, every figure derived
    from the profile; `provenance` names, for each figure, whether it is declared or derived and from what."""
    if cfg.gpus <= 0:
        raise ProfileError(profile["name"], ["declares a GPU host; a CPU job (gpus 0) is planned on this host, "
                                             "without --profile"])
    topo = declared_topology(profile)
    job = Job.from_config(cfg, topo, model_cfg)
    cast = record_cast(cfg)
    g, h = profile["gpus"], profile["host"]
    world = cfg.world_size
    hbm_bps = g["hbm_gbps"] * 1e9 * HBM_EFFICIENCY
    dram_bps = h["dram_gbps"] * 1e9 * DRAM_EFFICIENCY
    oneway = PCIE_LANE_GBPS[g["pcie_gen"]] * g["pcie_width"] * PCIE_COPY_EFFICIENCY  # GB/s
    record: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "key": "declared-" + _digest(profile, cfg, job),
        "host": topo["hostname"],
        "quick": False,
        "device": "cuda",
        "gpu_name": g["name"],
        "world": world,
        "p2p_disabled": False,
        "interconnect": job.interconnect,
        "software": None,
        "shape": calibration_shape(cfg, job.model_cfg),
        "declared": declared_marker(profile),
    }
    record["cpu"] = _cpu(job, dram_bps)
    record["update_in_step"] = _update_in_step(record["cpu"], job, cast)
    record["host_dram"] = {"capacity_GBps": dram_bps / 1e9, "update_bytes_per_param": job.update_dram_bytes(cast)}
    record["transfers"] = _transfers(oneway, world, dram_bps / 1e9)
    record["device_update"] = {"adamw_cast_s_per_1e9": DEVICE_UPDATE_BYTES * 1e9 / hbm_bps}
    record["unit"] = _unit(job, g, hbm_bps)
    record["embedding"] = {
        "fwd_s": 2 * job.tokens_per_micro_batch * job.hidden * job.pbytes / hbm_bps,
        "bwd_s": job.tokens_per_micro_batch * job.hidden * EMBEDDING_BWD_BYTES_PER_VALUE / hbm_bps,
    }
    record["loss_head"] = _loss_head(job, g, hbm_bps)
    record["collectives"] = _collectives(oneway, world, g["p2p"]) if world > 1 else None
    record["provenance"] = provenance(job)
    return record


def record_cast(cfg: Any) -> str:
    """The delivery cast the record's host update figures (update_in_step, host_dram) are derived for, as a measured
    calibration's are measured with one: the cast the config's policy fixes (PolicyConfig.fixed()), else the
    host's. The record serves every cast: `cpu` holds both casts' update rates (update_s_per_1e9 with the bf16
    cast, adamw_s_per_1e9 without), and update_in_step's factor over its own table is the same for either, so
    AutoPolicy prices both casts of a job from one record."""
    policy = getattr(cfg, "policy", None)
    return policy.fixed().get("delivery_cast", "host") if policy is not None else "host"


def _digest(profile: dict[str, Any], cfg: Any, job: Job) -> str:
    ident = {k: profile[k] for k in ("name", "gpus", "host")}
    ident["shape"] = calibration_shape(cfg, job.model_cfg)
    ident["world"] = cfg.world_size
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _threads(job: Job) -> list[int]:
    """The thread counts of the table, as calibration measures a GPU job's: the rank's, every rank's, and a quarter,
    half and all of the cores."""
    c = job.cores
    return sorted({job.cpu_threads, min(c, job.cpu_threads * job.world), c, max(1, c // 4), max(1, c // 2)})


def _cpu(job: Job, dram_bps: float) -> dict[str, Any]:
    threads = _threads(job)
    update_bytes = UPDATE_DRAM_BYTES[job.precision]

    def per_1e9(bytes_per_param: int, per_thread: float, t: int) -> float:
        return max(bytes_per_param * 1e9 / dram_bps, 1e9 / (per_thread * t))

    return {
        "threads": threads,
        "adamw_s_per_1e9": [per_1e9(UPDATE_DRAM_BYTES["fp32"], ADAMW_PARAMS_PER_S_PER_THREAD, t) for t in threads],
        "update_s_per_1e9": [per_1e9(update_bytes, UPDATE_PARAMS_PER_S_PER_THREAD, t) for t in threads],
        "copy_GBps": [min(dram_bps / 1e9, COPY_GBPS_PER_THREAD * t) for t in threads],
    }


def _update_in_step(cpu: dict[str, Any], job: Job, cast: str) -> dict[str, Any]:
    """The host update beside the issuing thread, as calibration measures it, under delivery_cast `cast`."""
    t = job.cpu_threads
    table = cpu[job.update_table(cast)]
    alone = table[cpu["threads"].index(t)]
    return {"threads": t, "alone_s_per_1e9": alone, "beside_load_s_per_1e9": alone * UPDATE_IN_STEP_FACTOR,
            "cast": job.host_cast(cast)}


def _transfers(oneway: float, world: int, dram_gbps: float) -> dict[str, Any]:
    def at(chunk_mib: int) -> float:
        nbytes = chunk_mib * 2**20
        return nbytes / (nbytes / (oneway * 1e9) + COPY_CHUNK_OVERHEAD_S) / 1e9

    one = [at(c) for c in CHUNK_MIB]
    out: dict[str, Any] = {"chunk_mib": list(CHUNK_MIB), "h2d_GBps": one, "d2h_GBps": list(one)}
    if world > 1:  # every GPU copying at once shares the host's DRAM
        every = [min(v, dram_gbps / world) for v in one]
        out.update(h2d_all_GBps=every, d2h_all_GBps=list(every))
    out["bidir_GBps"] = 2 * oneway * PCIE_BIDIR_FRACTION
    out["latency_s"] = COPY_LATENCY_S
    return out


def layer_flops(job: Job) -> tuple[float, float]:
    """(matmul, attention) FLOPs of one decoder layer's forward at the job's (micro-batch, seq)
    (slidedp.model_sizing.layer_forward_flops)."""
    from slidedp.model_sizing import layer_forward_flops, shape_of

    return layer_forward_flops(shape_of(job.model_cfg), job.micro_batch, job.seq)


def _unit(job: Job, g: dict[str, Any], hbm_bps: float) -> dict[str, Any]:
    from slidedp.planning.memory_model import estimate_saved_bytes

    peak = g["bf16_dense_tflops"] * 1e12
    matmul, attention = layer_flops(job)
    saved = float(estimate_saved_bytes(job))
    fwd = matmul / (peak * MATMUL_EFFICIENCY) + attention / (peak * ATTENTION_EFFICIENCY)
    fwd += saved * FORWARD_BYTES_PER_SAVED_BYTE / hbm_bps
    bwd = (matmul * MATMUL_BACKWARD_RATIO / (peak * MATMUL_EFFICIENCY)
           + attention * ATTENTION_BACKWARD_RATIO / (peak * ATTENTION_EFFICIENCY)
           + saved * BACKWARD_BYTES_PER_SAVED_BYTE / hbm_bps)
    return {
        "micro_batch": job.micro_batch,
        "seq": job.seq,
        "tokens": job.tokens_per_micro_batch,
        "flops_fwd": matmul + attention,
        "fwd_keep_s": fwd,
        "bwd_keep_s": bwd,
        "fwd_checkpoint_s": fwd,  # the same forward, without keeping its graph
        "bwd_checkpoint_s": fwd + bwd,  # the forward again with its graph, then the backward
        "recompute_s": fwd,
        "saved_keep_bytes": saved,
        "saved_checkpoint_bytes": float(job.tokens_per_micro_batch * job.hidden * job.pbytes),
        "saved_source": "estimated: what a decoder layer keeps for backward, counted (memory_model.estimate_saved_bytes)",
    }


def _loss_head(job: Job, g: dict[str, Any], hbm_bps: float) -> dict[str, Any]:
    """Per token: the lm_head's forward and both gradients (6 h V FLOPs) and the logits' fp32 forms written and
    read; per chunk: the lm_head weight gradient written, read again and added into the step's fp32 sum (the sum
    read and written)."""
    peak = g["bf16_dense_tflops"] * 1e12
    per_token = 6.0 * job.hidden * job.vocab / (peak * MATMUL_EFFICIENCY)
    per_token += 2.0 * job.vocab * (2 * job.pbytes + 12) / hbm_bps
    per_chunk = job.vocab * job.hidden * (2 * job.pbytes + 8) / hbm_bps
    return {"s_per_token": per_token, "s_per_chunk": per_chunk, "accumulates": True}


def _collectives(oneway: float, world: int, p2p: bool) -> dict[str, Any]:
    bus = oneway * 1e9 * (COLLECTIVE_P2P_FRACTION if p2p else COLLECTIVE_VIA_HOST_FRACTION)
    rows = [{"bytes": b, "s": COLLECTIVE_LATENCY_S + (world - 1) / world * b / bus} for b in COLLECTIVE_SIZES]
    return {"backend": "nccl", "world": world, "all_gather": rows, "reduce_scatter": [dict(r) for r in rows]}


def provenance(job: Job) -> dict[str, dict[str, str]]:
    """Each figure of the declared calibration: `declared` (the profile's own) or `derived` (from which declared
    figures, under which assumption). Nothing is measured."""
    def derived(frm: str, how: str) -> dict[str, str]:
        return {"kind": "derived", "from": frm, "assumes": how}

    out = {
        "gpu_name": {"kind": "declared", "from": "gpus.name"},
        "world": {"kind": "declared", "from": "gpus.count (the job's gpus)"},
        "interconnect": {"kind": "declared", "from": "gpus.count and gpus.p2p"},
        "cpu": derived("host.dram_gbps, host.cores",
                       f"the host update moves {UPDATE_DRAM_BYTES[job.precision]} B/param (AdamW alone 28) at "
                       f"{DRAM_EFFICIENCY:.0%} of dram_gbps, or {UPDATE_PARAMS_PER_S_PER_THREAD:.2g} params/s per "
                       f"thread ({ADAMW_PARAMS_PER_S_PER_THREAD:.2g} for AdamW) where fewer threads bind; copies at "
                       f"{COPY_GBPS_PER_THREAD:g} GB/s per thread up to that share of dram_gbps"),
        "update_in_step": derived("cpu", f"the update runs {UPDATE_IN_STEP_FACTOR:g}x slower beside the issuing "
                                  "thread"),
        "host_dram": derived("host.dram_gbps", f"{DRAM_EFFICIENCY:.0%} of it"),
        "transfers": derived("gpus.pcie_gen, gpus.pcie_width",
                             f"{PCIE_COPY_EFFICIENCY:.0%} of the link per direction, "
                             f"{COPY_CHUNK_OVERHEAD_S * 1e6:g} us per chunk; both directions together "
                             f"{PCIE_BIDIR_FRACTION:.0%} of twice one; every GPU at once shares DRAM"),
        "device_update": derived("gpus.hbm_gbps", f"{DEVICE_UPDATE_BYTES} B/param at {HBM_EFFICIENCY:.0%} of it"),
        "unit": derived("gpus.bf16_dense_tflops, gpus.hbm_gbps and the model config",
                        f"matmul FLOPs at {MATMUL_EFFICIENCY:.0%} and causal attention at "
                        f"{ATTENTION_EFFICIENCY:.0%} of the dense peak (backward {MATMUL_BACKWARD_RATIO:g}x and "
                        f"{ATTENTION_BACKWARD_RATIO:g}x), plus the saved bytes moved "
                        f"{FORWARD_BYTES_PER_SAVED_BYTE:g}x forward and {BACKWARD_BYTES_PER_SAVED_BYTE:g}x backward at "
                        f"{HBM_EFFICIENCY:.0%} of hbm_gbps; saved bytes counted, not measured"),
        "embedding": derived("gpus.hbm_gbps", f"a gather forward, {EMBEDDING_BWD_BYTES_PER_VALUE:g} B per value "
                             "backward"),
        "loss_head": derived("gpus.bf16_dense_tflops, gpus.hbm_gbps",
                             f"6 h V FLOPs per token at {MATMUL_EFFICIENCY:.0%} of the peak and the logits' fp32 "
                             "forms; peak memory estimated as without calibration"),
    }
    if job.world > 1:
        out["collectives"] = derived(
            "gpus.pcie_gen, gpus.pcie_width, gpus.p2p",
            f"bus bandwidth {COLLECTIVE_P2P_FRACTION:.0%} (P2P) or {COLLECTIVE_VIA_HOST_FRACTION:.0%} (through host "
            f"memory) of a one-direction copy, {COLLECTIVE_LATENCY_S * 1e6:g} us each",
        )
    return out


def declared_note(declared: dict[str, Any]) -> str:
    """How a plan on a declared host says where its times come from."""
    return (f"declared host {declared.get('profile')} ({declared.get('description')}): every time is predicted "
            "from the profile's declared figures, not measured here")
