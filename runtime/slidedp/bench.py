"""`slidedp bench`: SlideDP step time for a model shape over several policies, next to peers, in one command.

    PYTHONPATH=runtime python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 4 --seq 2048 --steps 8 \\
        --policies sharded:gpu,replicated:gpu,sharded:host,replicated:host --peers fsdp2-offload:0 --out bench.jsonl

Each policy is
`delivery:grad_reduce[:activations[:clip[:resident[:cast[:edge_update[:device_layers[:staging_slots]]]]]]]`, the
shorthand of slidedp.policy: parse_shorthand reads it into a PolicyConfig, whose fixed() keys are the job config's
`policy` section (`auto` in a field is
AutoPolicy's choice, and so are the cast and staging slots a form with `auto` omits; other omitted fields keep every
unit's update on the host, unlike a job config's auto defaults), and a form without `auto` is an ExecutionPolicy
(ExecutionPolicy.from_shorthand, .shorthand()): its omitted cast is the host's. `--policy-set KEY=VALUE,...` sets
policy keys the shorthand has no field for (cast_scratch_mb=256, chunk_mb=256) on every SlideDP policy of the command.
Each peer is `fsdp2[:keep[:clip[:layers]]]` (FSDP2 GPU-resident, every decoder layer checkpointed but the first
`keep`; `none`: no checkpointing; layers: `eager` (default) or `compiled`, each decoder layer through torch.compile
as `policy.compiled_layers` does) or `fsdp2-offload[:keep[:clip[:layers]]]` (FSDP2 + CPUOffloadPolicy), see
slidedp.peers.fsdp2;
or `ds-zero2[:clip]` / `ds-zero3[:clip]` (DeepSpeed ZeRO-Offload: optimizer, or optimizer and parameters, on the
CPU with DeepSpeedCPUAdam), see slidedp.peers.deepspeed_zero.
Data are token ids written to a temporary jsonl: `random` ids, or `pattern` (each row repeats
a short random motif over 1024 token ids, so a random-init model's loss visibly falls). All SlideDP policies of one command train on
one host state (StateCache): weights are initialised once. The planner predicts each policy before it runs (train's
`predict_explicit`), and the row carries the prediction beside the measurement. The first `--warmup` steps are
excluded; the median of the rest is reported with peak HBM, host RSS and per-rank bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from slidedp.policy import LAYER_MODES, parse_shorthand


def _rows(kind: str, rows: int, seq: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    if kind == "random":
        return [[rng.randrange(vocab) for _ in range(seq)] for _ in range(rows)]
    out = []
    alphabet = min(vocab, 1024)  # a small alphabet: the loss falls from the first steps, before any copying
    for _ in range(rows):
        motif = [rng.randrange(alphabet) for _ in range(rng.randrange(16, 65))]
        out.append((motif * (seq // len(motif) + 1))[:seq])
    return out


def _write(path: str, rows: list[list[int]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"input_ids": r}) + "\n")


def parse_policy_set(text: str) -> dict[str, Any]:
    """`--policy-set`: comma-separated KEY=VALUE policy keys (docs/interfaces.md, the config's `policy` section), each
    value read as `slidedp train --set` reads it (config.override_value); ValueError naming what is wrong."""
    from slidedp.config import PolicyConfig, override_value

    keys = {f.name for f in dataclasses.fields(PolicyConfig)}
    out: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"--policy-set {item!r}: write KEY=VALUE, e.g. cast_scratch_mb=256")
        if key not in keys:
            raise ValueError(f"--policy-set: {key!r} is not a policy key; keys: {', '.join(sorted(keys))}")
        out[key] = override_value(value)
    return out


def job_config(model: str, gpus: int, mbs: int, seq: int, steps: int, policy: str, data: str, out_dir: str,
               threads: int | None, lr: float = 1e-5, gpu_memory_gib: float | None = None,
               policy_set: dict[str, Any] | None = None) -> dict:
    """The job one bench row runs: the shorthand's policy, with the keys of `--policy-set` over it."""
    requested, clip = parse_shorthand(policy)
    cfg = {"model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": seq,
           "micro_batch_size": mbs, "steps": steps, "gpus": gpus, "ranks": 1 if gpus else 2, "precision": "bf16",
           "output_dir": out_dir, "export": False, "optimizer": {"lr": lr, "max_grad_norm": clip},
           "schedule": {"warmup_steps": 0, "decay": "constant"},
           "policy": {**requested.fixed(), **(policy_set or {})},
           "checkpoint": {"interval": 0}}
    if threads:
        cfg["cpu_threads"] = threads
    if gpu_memory_gib:
        cfg["gpu_memory_gib"] = gpu_memory_gib
    return cfg


def plan_one(cfg: dict) -> dict:
    """What train() would plan for this policy (calibrating first where the cache lacks this shape)."""
    from slidedp.config import JobConfig
    from slidedp.model_shape import read_shape
    from slidedp.planning.resolve import resolve_policy

    job = JobConfig.from_dict(cfg)
    policy, plan = resolve_policy(job, read_shape(job.model).num_layers,
                                  on_log=lambda line: print("   ", line, flush=True), predict_explicit=True)
    pred = plan.get("predicted") or {}
    return {"chosen": policy.summary(), "predicted_step_s": pred.get("step_time_s"),
            "predicted_phases": pred.get("phases"), "predicted_hbm_gib": pred.get("hbm_peak_gib"),
            "bound_s": (pred.get("bound") or {}).get("step_time_s"),
            "calibration": plan.get("calibration"), "why": plan.get("why")}


def run_one(model: str, gpus: int, mbs: int, seq: int, steps: int, policy: str, data: str, out_dir: str,
            threads: int | None, lr: float = 1e-5, state_cache=None, gpu_memory_gib: float | None = None,
            predict: bool = True, policy_set: dict[str, Any] | None = None) -> dict:
    from slidedp.launch import train

    cfg = job_config(model, gpus, mbs, seq, steps, policy, data, out_dir, threads, lr, gpu_memory_gib, policy_set)
    t0 = time.perf_counter()
    result = train(cfg, on_log=lambda line: print("   ", line, flush=True), state_cache=state_cache,
                   predict_explicit=predict)
    plan = result.plan or {}
    return {"policy": policy, "wall_s": time.perf_counter() - t0, "metrics": result.metrics,
            "chosen": result.policy.summary() if result.policy is not None else {},
            "predicted_step_s": (plan.get("predicted") or {}).get("step_time_s"),
            "bound_s": ((plan.get("predicted") or {}).get("bound") or {}).get("step_time_s"),
            "prediction_check": result.prediction_check}


PEER_SPECS = ("fsdp2[:keep[:clip[:layers]]], fsdp2-offload[:keep[:clip[:layers]]] (layers: eager or compiled), "
              "ds-zero2[:clip] or ds-zero3[:clip]")


def parse_peer(spec: str) -> dict:
    """A peer spec: fsdp2[:keep[:clip[:layers]]], fsdp2-offload[:keep[:clip[:layers]]], ds-zero2[:clip] or
    ds-zero3[:clip] (layers: eager or compiled)."""
    parts = spec.split(":")
    if parts[0] in ("fsdp2", "fsdp2-offload") and len(parts) <= 4:
        keep = None if len(parts) > 1 and parts[1] == "none" else int(parts[1]) if len(parts) > 1 else 0
        layers = parts[3] if len(parts) > 3 else "eager"
        if layers not in LAYER_MODES:
            raise ValueError(f"peer {spec!r}: layers must be one of {', '.join(LAYER_MODES)}, got {layers!r}")
        return {"name": parts[0], "keep": keep, "clip": float(parts[2]) if len(parts) > 2 else 0.0,
                "compiled_layers": layers == "compiled"}
    if parts[0] in ("ds-zero2", "ds-zero3") and len(parts) <= 2:
        return {"name": parts[0], "clip": float(parts[1]) if len(parts) > 1 else 0.0}
    raise ValueError(f"peer {spec!r}: expected {PEER_SPECS}")


def run_peer(spec: str, model: str, gpus: int, mbs: int, seq: int, steps: int, warmup: int, threads: int | None,
             lr: float, rows: list[list[int]], gpu_memory_gib: float | None = None) -> dict:
    """One peer's row (spec as parse_peer reads it)."""
    peer = parse_peer(spec)
    ranks = 0 if gpus else 2  # the CPU form of a peer runs two gloo ranks
    if peer["name"].startswith("fsdp2"):
        from slidedp.peers.fsdp2 import run_fsdp2

        row = run_fsdp2(model, gpus, mbs, seq, steps, warmup, offload=peer["name"] == "fsdp2-offload",
                        keep_layers=peer["keep"], threads=threads, ranks=ranks, lr=lr, max_grad_norm=peer["clip"],
                        data_rows=rows, gpu_memory_gib=gpu_memory_gib, compiled_layers=peer["compiled_layers"])
    else:
        from slidedp.peers.deepspeed_zero import run_deepspeed

        row = run_deepspeed(model, gpus, mbs, seq, steps, warmup, stage=int(peer["name"][-1]), threads=threads,
                            lr=lr, max_grad_norm=peer["clip"], data_rows=rows, ranks=ranks,
                            gpu_memory_gib=gpu_memory_gib)
    return {"policy": spec, **row}


# carried from the first of a row's metrics records that has them: the cap it ran under and its start-up (all on
# the first record, but moments_paged_s where the paging ended after step 1; docs/interfaces.md §3)
FIRST_RECORD_KEYS = ("gpu_memory_cap", "startup_s", "time_to_first_step_s", "moments_paged_s", "rank_startup_s",
                     "startup_parts_s")


def summarise(row: dict, warmup: int) -> dict:
    ms = row["metrics"][warmup:] or row["metrics"]
    med = statistics.median(m["step_time_s"] for m in ms)
    pick = min(ms, key=lambda m: abs(m["step_time_s"] - med))
    pred = row.get("predicted_step_s")
    retries = [sum(m["alloc_retries"]) for m in ms if m.get("alloc_retries")]
    return {"policy": row["policy"], "chosen": row.get("chosen"), "step_s": med,
            "predicted_step_s": pred, "predicted_error": (pred / med - 1.0) if pred else None,
            "bound_s": row.get("bound_s"), "of_bound": (row["bound_s"] / med) if row.get("bound_s") else None,
            "tokens_per_s": pick["tokens_per_s"],
            "tflops": pick["tflops"], "hbm_peak_gib": max(max(m["hbm_peak_gib"] or [0.0]) for m in ms),
            "hbm_device_used_gib": max(max(m.get("hbm_device_used_gib") or [0.0]) for m in ms),
            "alloc_retries": sum(retries) if retries else None,  # None: no GPU figures
            **{key: next((m[key] for m in row["metrics"] if key in m), None) for key in FIRST_RECORD_KEYS},
            "host_rss_gib": pick["host_rss_gib"], "phases": pick["phases"], "cpu_s": pick.get("cpu_s"),
            "bytes": pick["bytes"],
            "loss_first": row["metrics"][0]["loss"], "loss_last": row["metrics"][-1]["loss"],
            "losses": [m["loss"] for m in row["metrics"]], "times": [m["step_time_s"] for m in row["metrics"]],
            "grad_norm": pick.get("grad_norm"), "clipped": pick.get("clipped"),
            "prediction_check": row.get("prediction_check")}


def build_parser() -> argparse.ArgumentParser:
    """`slidedp bench`'s options."""
    p = argparse.ArgumentParser(prog="slidedp bench",
                                description="SlideDP step time for one model shape over several policies, next to "
                                "peers (FSDP2, DeepSpeed ZeRO-Offload), in one command; see docs/benchmarks.md.")
    p.add_argument("--model", default="qwen3-8b",
                   help="the model: a preset name (`slidedp presets`, random init) or a local Hugging Face model "
                   "directory (default: %(default)s)")
    p.add_argument("--gpus", type=int, default=2,
                   help="GPUs to train on, one rank each; 0: the CPU, with two gloo ranks (default: %(default)s)")
    p.add_argument("--mbs", type=int, default=4, help="micro-batch size per rank, in sequences (default: %(default)s)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length in tokens (default: %(default)s)")
    p.add_argument("--steps", type=int, default=8,
                   help="optimizer steps each policy and peer runs (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2,
                   help="first steps left out of the reported median step time (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per rank, for SlideDP's host update and the peers' CPU work (default: the "
                   "cores this process may use, divided by the ranks)")
    p.add_argument("--policies", default="sharded:gpu",
                   help="comma-separated SlideDP policies, each delivery:grad_reduce[:activations[:clip[:resident"
                   "[:cast[:edge_update[:device_layers[:staging_slots]]]]]]] (`auto` for AutoPolicy's choice); "
                   "empty: peers only (default: %(default)s)")
    p.add_argument("--policy-set", default="",
                   help="policy keys set on every SlideDP policy of the command, beyond what the shorthand names: "
                   "comma-separated KEY=VALUE, e.g. cast_scratch_mb=256,chunk_mb=256 (default: none)")
    p.add_argument("--peers", default="",
                   help=f"comma-separated peer specs run after the policies: {PEER_SPECS}, e.g. "
                   "fsdp2:8,fsdp2-offload:0,fsdp2:8:0:compiled (default: none)")
    p.add_argument("--data", choices=("random", "pattern"), default="random",
                   help="token ids to train on: random ids, or pattern (rows repeating a short random motif, so a "
                   "random-init model's loss visibly falls) (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate, constant (default: %(default)s)")
    p.add_argument("--no-plan", action="store_true",
                   help="do not ask the planner for a prediction per policy (default: each row carries the "
                   "planner's prediction beside the measurement)")
    p.add_argument("--plan-only", action="store_true",
                   help="write each policy's prediction (as `slidedp plan` makes it) without training (default: "
                   "train)")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="GPU memory each rank may use, in GiB, CUDA context included: the job key gpu_memory_gib "
                   "for SlideDP's rows and the same allocator limit for every peer's ranks, to reproduce a smaller "
                   "card's memory on a bigger one (default: the whole card)")
    p.add_argument("--out", default=None,
                   help="append one JSON line per policy and peer to this file (default: none; the summary table "
                   "is printed either way)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from slidedp.launch import StateCache
    from slidedp.presets import PRESETS

    policies = [x for x in args.policies.split(",") if x]
    peers = [x for x in args.peers.split(",") if x]
    for policy in policies:
        parse_shorthand(policy)  # a typo fails before an hour of set-up, not after
    try:
        policy_set = parse_policy_set(args.policy_set)
    except ValueError as exc:
        print(f"slidedp bench: {exc}", file=sys.stderr)
        return 2
    for spec in peers:
        parse_peer(spec)
    vocab = PRESETS[args.model]["vocab_size"] if args.model in PRESETS else 32000
    tmp = tempfile.mkdtemp(prefix="slidedp-bench-")
    data = os.path.join(tmp, "data.jsonl")
    token_rows = _rows(args.data, args.steps * args.mbs * max(1, args.gpus), args.seq, vocab)
    _write(data, token_rows)
    rows = []
    cache = StateCache()

    def record(row: dict) -> None:
        row.update(model=args.model, gpus=args.gpus, mbs=args.mbs, seq=args.seq, data=args.data,
                   gpu_memory_gib=args.gpu_memory_gib)
        rows.append(row)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    if args.plan_only:
        for policy in policies:
            print(f"== plan {args.model} gpus={args.gpus} mbs={args.mbs} seq={args.seq} policy={policy}", flush=True)
            try:
                row = {"policy": policy, "plan_only": True, **plan_one(job_config(
                    args.model, args.gpus, args.mbs, args.seq, args.steps, policy, data, os.path.join(tmp, "plan"),
                    args.threads, args.lr, args.gpu_memory_gib, policy_set))}
                print(f"    predicted step {row['predicted_step_s']} s; chosen {row['chosen']}", flush=True)
            except Exception as exc:
                row = {"policy": policy, "plan_only": True, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
            record(row)
        return 0
    try:
        for policy in policies:
            print(f"== {args.model} gpus={args.gpus} mbs={args.mbs} seq={args.seq} policy={policy}", flush=True)
            try:
                row = summarise(run_one(args.model, args.gpus, args.mbs, args.seq, args.steps, policy, data,
                                        os.path.join(tmp, policy.replace(":", "-")), args.threads, args.lr,
                                        cache, args.gpu_memory_gib, predict=not args.no_plan,
                                        policy_set=policy_set), args.warmup)
            except Exception as exc:  # one failing policy must not hide the others' results
                row = {"policy": policy, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
            record(row)
    finally:
        cache.close()  # the peers need the host RAM the state holds
    for spec in peers:
        print(f"== {args.model} gpus={args.gpus} mbs={args.mbs} seq={args.seq} peer={spec}", flush=True)
        try:
            row = run_peer(spec, args.model, args.gpus, args.mbs, args.seq, args.steps, args.warmup, args.threads,
                           args.lr, token_rows, args.gpu_memory_gib)
        except Exception as exc:
            row = {"policy": spec, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        record(row)
    print(f"\n{'run':34s} {'step s':>8s} {'pred s':>7s} {'bound s':>7s} {'tok/s':>9s} {'HBM GiB':>8s} "
          f"{'RSS GiB':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['policy']:34s} ERROR {r['error'][-300:]}")
        else:
            pred = f"{r['predicted_step_s']:7.3f}" if r.get("predicted_step_s") else f"{'-':>7s}"
            bnd = f"{r['bound_s']:7.3f}" if r.get("bound_s") else f"{'-':>7s}"
            print(f"{r['policy']:34s} {r['step_s']:8.3f} {pred} {bnd} {r['tokens_per_s']:9.0f} "
                  f"{r['hbm_peak_gib']:8.1f} {r['host_rss_gib']:8.1f}")
    return 0
