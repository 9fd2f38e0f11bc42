"""The clipped host update's pieces alone, against the unclipped update, on units the size of a decoder layer:
seconds per 1e9 parameters at the job's threads (medians), as one JSON line per piece.

In the step timelines of clipped runs (`hold` and `final` events) the held copy of a unit's gradient took ~0.4x and
the post-norm update ~1.4x the unclipped run's update of the same unit, on six hosts. This says how much of that the
pieces cost with nothing beside them (the engine's own functions and chunking: slidedp.step.optimizer):

    update        AdamW from an fp32 gradient (the unclipped update with the cast on the GPU)
    update_cast   the same and the bf16 delivery copy (the cast on the host)
    hold_bf16     the gradient copied into the held gradient in bf16 (one rank, bf16 layers)
    memcpy        an fp32 copy of the same bytes, the rate calibration's host copy figure is
    post_norm_C   the post-norm update from a bf16 held gradient as the engine runs it, widened and scaled C
                  elements at a time (the engine's WIDEN_CHUNK and each 2^k of --chunks)
    post_norm_widened_whole   the gradient widened and scaled whole first, then one AdamW pass

    PYTHONPATH=runtime python3 scripts/probe_post_norm.py [--numel 193000000] [--threads 16] [--units 3]
        [--chunks 18,20,22,24]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from slidedp.config import OptimizerConfig
from slidedp.step.optimizer import WIDEN_CHUNK, adamw_, update_shard_

OPT = OptimizerConfig(lr=1e-6, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
COEF = 0.5  # a clip factor that scales, as in a step whose norm is over the limit


class Unit:
    def __init__(self, n: int):
        self.p, self.m, self.v = torch.randn(n), torch.zeros(n), torch.zeros(n)
        self.g = torch.randn(n) * 1e-3
        self.held = self.g.to(torch.bfloat16)
        self.deliver = torch.empty(n, dtype=torch.bfloat16)
        self.copy = torch.empty(n)


def post_norm(u: Unit, chunk: int, scratch: torch.Tensor) -> None:
    """Slidedp.step.optimizer.Updater._post_norm's whole pass over a bf16 held gradient, at `chunk` elements."""
    n = u.p.numel()
    for a in range(0, n, chunk):
        k = min(chunk, n - a)
        g = scratch[:k]
        g.copy_(u.held[a : a + k])
        g.mul_(COEF)
        adamw_(u.p[a : a + k], g, u.m[a : a + k], u.v[a : a + k], 2, 1e-6, OPT)


def widened_whole(u: Unit, wide: torch.Tensor) -> None:
    wide.copy_(u.held)
    wide.mul_(COEF)
    adamw_(u.p, wide, u.m, u.v, 2, 1e-6, OPT)


def timed(fn: Callable[[Unit], None], units: list[Unit], reps: int) -> float:
    """Median seconds of one unit's piece, the units taken in turn so that none is read back from cache."""
    fn(units[0])
    out = []
    for i in range(reps * len(units)):
        t0 = time.perf_counter()
        fn(units[i % len(units)])
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=193_000_000)  # a Qwen3-8B decoder layer
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", default="18,20,22,24", help="powers of two of the post-norm chunks tried")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = args.numel
    units = [Unit(n) for _ in range(args.units)]
    wide = torch.zeros(n)
    scratch = torch.zeros(max([WIDEN_CHUNK] + [1 << int(k) for k in args.chunks.split(",")]))
    pieces: dict[str, Callable[[Unit], None]] = {
        "update": lambda u: adamw_(u.p, u.g, u.m, u.v, 2, 1e-6, OPT),
        "update_cast": lambda u: update_shard_(u.p, u.g, u.m, u.v, u.deliver, 2, 1e-6, OPT),
        "hold_bf16": lambda u: u.held.copy_(u.g),
        "memcpy": lambda u: u.copy.copy_(u.g),
    }
    for c in sorted({WIDEN_CHUNK} | {1 << int(k) for k in args.chunks.split(",")}):
        pieces[f"post_norm_{c}"] = lambda u, c=c: post_norm(u, c, scratch)
    pieces["post_norm_widened_whole"] = lambda u: widened_whole(u, wide)
    base = None
    for name, fn in pieces.items():
        s = timed(fn, units, args.reps)
        base = base or s
        print(json.dumps({"piece": name, "numel": n, "threads": args.threads, "s": round(s, 5),
                          "s_per_1e9": round(s / n * 1e9, 4), "of_update": round(s / base, 3)}), flush=True)


if __name__ == "__main__":
    main()
