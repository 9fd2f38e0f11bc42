"""`slidedp bench`: SlideDP step time for a model shape over several policies, in one command.

    PYTHONPATH=runtime python3 -m slidedp.cli bench --model qwen3-8b --gpus 2 --mbs 4 --seq 2048 --steps 8 \\
        --policies sharded:gpu,replicated:gpu,sharded:host,replicated:host --out bench.jsonl

Each policy is `delivery:grad_reduce[:activations[:clip[:resident layers]]]`. Data are random token ids written to a temporary
jsonl (the model is random-init, so the loss only shows the step is wired). The first `--warmup` steps are
excluded; the median of the rest is reported with peak HBM, host RSS and per-rank bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time


def _data(path: str, rows: int, seq: int, vocab: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(seq)]}) + "\n")


def run_one(model: str, gpus: int, mbs: int, seq: int, steps: int, policy: str, data: str, out_dir: str,
            threads: int | None) -> dict:
    from slidedp.launch import train

    parts = policy.split(":")
    delivery, grad = parts[0], parts[1]
    acts = parts[2] if len(parts) > 2 else "checkpoint"
    clip = float(parts[3]) if len(parts) > 3 else 0.0
    resident = int(parts[4]) if len(parts) > 4 else 0
    cfg = {"model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": seq,
           "micro_batch_size": mbs, "steps": steps, "gpus": gpus, "ranks": 1 if gpus else 2, "precision": "bf16",
           "output_dir": out_dir, "export": False, "optimizer": {"lr": 1e-5, "max_grad_norm": clip},
           "policy": {"delivery": delivery, "grad_reduce": grad, "activations": acts, "resident_units": resident},
           "checkpoint": {"interval": 0}}
    if threads:
        cfg["cpu_threads"] = threads
    t0 = time.perf_counter()
    result = train(cfg, on_log=lambda line: print("   ", line, flush=True))
    return {"policy": policy, "wall_s": time.perf_counter() - t0, "metrics": result.metrics}


def summarise(row: dict, warmup: int) -> dict:
    ms = row["metrics"][warmup:] or row["metrics"]
    med = statistics.median(m["step_time_s"] for m in ms)
    pick = min(ms, key=lambda m: abs(m["step_time_s"] - med))
    return {"policy": row["policy"], "step_s": med, "tokens_per_s": pick["tokens_per_s"],
            "tflops": pick["tflops"], "hbm_peak_gib": max(max(m["hbm_peak_gib"] or [0.0]) for m in ms),
            "host_rss_gib": pick["host_rss_gib"], "phases": pick["phases"], "bytes": pick["bytes"],
            "loss_first": row["metrics"][0]["loss"], "loss_last": row["metrics"][-1]["loss"]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slidedp bench")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--mbs", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="CPU threads per rank for the host update")
    p.add_argument("--policies", default="sharded:gpu")
    p.add_argument("--out", default=None, help="append one JSON line per policy here")
    args = p.parse_args(argv)
    from slidedp.presets import PRESETS

    vocab = PRESETS[args.model]["vocab_size"] if args.model in PRESETS else 32000
    tmp = tempfile.mkdtemp(prefix="slidedp-bench-")
    data = os.path.join(tmp, "data.jsonl")
    _data(data, args.steps * args.mbs * max(1, args.gpus), args.seq, vocab)
    rows = []
    for policy in args.policies.split(","):
        print(f"== {args.model} gpus={args.gpus} mbs={args.mbs} seq={args.seq} policy={policy}", flush=True)
        try:
            row = summarise(run_one(args.model, args.gpus, args.mbs, args.seq, args.steps, policy, data,
                                    os.path.join(tmp, policy.replace(":", "-")), args.threads), args.warmup)
        except Exception as exc:  # one failing policy must not hide the others' results
            row = {"policy": policy, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        row.update(model=args.model, gpus=args.gpus, mbs=args.mbs, seq=args.seq)
        rows.append(row)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
    print(f"\n{'policy':34s} {'step s':>8s} {'tok/s':>9s} {'TFLOP/s':>8s} {'HBM GiB':>8s} {'RSS GiB':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['policy']:34s} ERROR {r['error'][-300:]}")
        else:
            print(f"{r['policy']:34s} {r['step_s']:8.3f} {r['tokens_per_s']:9.0f} {r['tflops']:8.1f} "
                  f"{r['hbm_peak_gib']:8.1f} {r['host_rss_gib']:8.1f}")
    return 0
