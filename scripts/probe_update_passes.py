"""What the post-norm host update of a clipped step could leave to after the next forward has its weights.

The next forward needs only a unit's new weights; its new AdamW moments are needed one step later. The weights need
both moments' new values, but not written back: pass 1 runs torch's fused CPU AdamW on the unit's parameters in
place with its moments copied into a cache-sized scratch (their new values are dropped), and writes the bf16
delivery copy; pass 2 runs the same AdamW again with a scratch parameter and the moments in place. Both passes see
the same inputs in the same chunks, so the moments pass 2 writes are those pass 1 used, bit for bit.

    PYTHONPATH=runtime python3 scripts/probe_update_passes.py --params 1e9 --threads 16 [--out FILE]

Per variant, one JSON line: seconds per 1e9 parameters (median of --reps after one warm-up): the whole update as
the engine runs it today (bf16-held gradient widened chunk by chunk, AdamW, the bf16 cast), pass 1 alone, pass 2
alone, and whether pass 1 + pass 2 leave exactly the state of the whole update.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

BETAS, LR, WD, EPS = (0.9, 0.95), 1e-4, 0.1, 1e-8


def adamw(p, g, m, v, step):
    torch._fused_adamw_([p], [g], [m], [v], [], [step], lr=LR, beta1=BETAS[0], beta2=BETAS[1], weight_decay=WD,
                        eps=EPS, amsgrad=False, maximize=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=1e9)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunks", default="1048576,4194304")
    ap.add_argument("--coef", type=float, default=0.37, help="clip factor applied to the gradient (1 = none)")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n = int(a.params)
    gen = torch.Generator().manual_seed(0)
    p, m, v = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3, torch.rand(n, generator=gen) * 1e-6
    held = torch.randn(n, generator=gen).bfloat16()
    deliv = torch.empty(n, dtype=torch.bfloat16)
    step = torch.tensor(3.0)
    base = (p.clone(), m.clone(), v.clone())
    out = open(a.out, "a") if a.out else None

    def restore():
        p.copy_(base[0])
        m.copy_(base[1])
        v.copy_(base[2])

    def measure(c: int) -> dict:
        g, sm, sv, sp = (torch.empty(c) for _ in range(4))

        def widen(lo, hi):
            w = g[: hi - lo]
            w.copy_(held[lo:hi])
            if a.coef < 1.0:
                w.mul_(a.coef)
            return w

        def whole():
            for lo in range(0, n, c):
                hi = min(n, lo + c)
                adamw(p[lo:hi], widen(lo, hi), m[lo:hi], v[lo:hi], step)
                deliv[lo:hi].copy_(p[lo:hi])

        def pass1():
            for lo in range(0, n, c):
                hi, k = min(n, lo + c), min(n, lo + c) - lo
                w = widen(lo, hi)
                sm[:k].copy_(m[lo:hi])
                sv[:k].copy_(v[lo:hi])
                adamw(p[lo:hi], w, sm[:k], sv[:k], step)
                deliv[lo:hi].copy_(p[lo:hi])

        def pass2():
            for lo in range(0, n, c):
                hi, k = min(n, lo + c), min(n, lo + c) - lo
                adamw(sp[:k], widen(lo, hi), m[lo:hi], v[lo:hi], step)

        def timed(fn):
            times = []
            for i in range(a.reps + 1):
                restore()
                t0 = time.perf_counter()
                fn()
                if i:
                    times.append(time.perf_counter() - t0)
            return statistics.median(times) / (n / 1e9)

        rows = {"whole": timed(whole), "pass1": timed(pass1), "pass2": timed(pass2)}
        restore()
        whole()
        ref = (p.clone(), m.clone(), v.clone(), deliv.clone())
        restore()
        pass1()
        pass2()
        same = all(torch.equal(x, y) for x, y in zip(ref, (p, m, v, deliv)))
        row = {"chunk": c, "threads": a.threads, "params": n, "s_per_1e9": rows, "same_bits": same,
               "pass1_of_whole": rows["pass1"] / rows["whole"]}
        return row


    for c in (int(x) for x in a.chunks.split(",")):
        row = measure(c)
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")

if __name__ == "__main__":
    main()
