"""What a bf16 gradient would save the host update: fused CPU AdamW on fp32 gradients against bf16 gradients
widened to fp32 chunk by chunk just before each chunk's AdamW (torch's fused CPU AdamW takes gradients of the
parameters' dtype only), so the widened chunk is read back from cache and DRAM sees 2 bytes of gradient instead of 4.

    PYTHONPATH=runtime python3 scripts/probe_grad_bf16.py --params 1e9 --threads 16 [--out FILE]

Prints one JSON line per variant: seconds per 1e9 parameters (median of --reps after one warm-up).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=1e9)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunks", default="262144,1048576,4194304,16777216")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n = int(a.params)
    p, m, v, g32 = (torch.empty(n) for _ in range(4))
    for t in (p, g32):
        t.normal_()
    m.zero_()
    v.zero_()
    g16 = g32.bfloat16()
    step = torch.tensor(1.0)

    def adamw(pp, gg, mm, vv):
        torch._fused_adamw_([pp], [gg], [mm], [vv], [], [step], lr=1e-5, beta1=0.9, beta2=0.95, weight_decay=0.1,
                            eps=1e-8, amsgrad=False, maximize=False)

    def chunked(c):
        scratch = torch.empty(c)

        def run():
            for lo in range(0, n, c):
                hi = min(n, lo + c)
                w = scratch[: hi - lo]
                w.copy_(g16[lo:hi])
                adamw(p[lo:hi], w, m[lo:hi], v[lo:hi])
        return run

    wide = torch.empty(n)
    variants = [("fp32 gradient", lambda: adamw(p, g32, m, v)),
                ("widen whole, then AdamW", lambda: (wide.copy_(g16), adamw(p, wide, m, v))),
                ("widen alone", lambda: wide.copy_(g16))]
    variants += [(f"bf16 gradient, widened in chunks of {int(c)}", chunked(int(c))) for c in a.chunks.split(",")]
    out = open(a.out, "a") if a.out else None
    for name, fn in variants:
        fn()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        row = {"variant": name, "threads": a.threads, "params": n,
               "s_per_1e9": sorted(times)[len(times) // 2] * 1e9 / n, "times": times}
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
