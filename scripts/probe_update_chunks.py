"""Host update cost by chunk size: AdamW then the bf16 delivery cast, per chunk, against one AdamW pass over the
whole shard followed by a separate cast (what the engine does). Seconds per 1e9 parameters, medians. Chunking
measured no faster on the GPU machine (docs/notebook/perf-notes.md), so the engine keeps whole passes.

    PYTHONPATH=runtime python3 scripts/probe_update_chunks.py [--numel 268435456] [--threads 16,32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from slidedp.config import OptimizerConfig
from slidedp.step.optimizer import adamw_, update_shard_

OPT = OptimizerConfig(lr=1e-6, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=1 << 28)
    ap.add_argument("--threads", default="16,32")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = args.numel
    p, g, m, v = torch.randn(n), torch.randn(n) * 1e-3, torch.zeros(n), torch.zeros(n)
    deliver = torch.empty(n, dtype=torch.bfloat16)

    def separate() -> None:
        update_shard_(p, g, m, v, deliver, 1, 1e-6, OPT)

    def chunked(c: int) -> None:
        for lo in range(0, n, c):
            hi = min(n, lo + c)
            adamw_(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], 1, 1e-6, OPT)
            deliver[lo:hi].copy_(p[lo:hi])

    variants = {"whole+separate cast": separate}
    for chunk in (1 << 18, 1 << 20, 1 << 22, 1 << 24):
        variants[f"chunk {chunk >> 10}K"] = (lambda c: lambda: chunked(c))(chunk)
    rows = []
    for t in (int(x) for x in args.threads.split(",")):
        torch.set_num_threads(t)
        for name, fn in variants.items():
            fn()
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            row = {"threads": t, "variant": name, "s_per_1e9": statistics.median(times) * 1e9 / n}
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
