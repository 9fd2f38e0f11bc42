"""The floor of the post-norm update: what the host update reads and writes, how fast the host moves bytes, and what
the GPU and its PCIe link could take over while clipping makes the update wait for the whole backward.

    PYTHONPATH=runtime python3 scripts/probe_update_floor.py --threads 16 --out floor.jsonl

Measured, each a median of --reps timed passes after one warm-up, on buffers larger than every cache:

* `dram_*`: the host's memory ceiling at the job's threads on shared-memory buffers mapped as the host state is:
  a read-only pass (sum), a copy (read + write) and a triad (two reads, one write); GB/s counts bytes read plus
  bytes written, as the cost model does.
* `host_update`: the engine's host update (`update_shard_`: fused AdamW, then the bf16 delivery cast) and AdamW
  alone, in seconds per 1e9 params and in GB/s at 34 and 28 B/param.
* `pcie_*`: page-locked host <-> GPU copies, each direction alone and both at once.
* `gpu_adamw`: the same fused fp32 AdamW on the GPU over HBM-resident tensors.
* `gpu_streamed`: the update as a GPU could do it for units whose gradient is already on the GPU: each chunk's fp32
  master and two moments copied in, updated there (bf16 copy made there too), and copied back, three streams in a
  pipeline, seconds per 1e9 params.
* `split_X`: the host updating a share X of the params while the GPU streams the rest at the same time, both from
  one start: the time until both are done, per 1e9 params in all, and each side's own time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch
from slidedp.config import OptimizerConfig
from slidedp.planning.microbench import median_time, state_like, update_buffers
from slidedp.step.optimizer import update_shard_

OPT = OptimizerConfig(lr=1e-6, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
GB = 1e9


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Streamed:
    """The GPU-side update of host-resident fp32 state: chunk in on one stream, AdamW on another, chunk out on a
    third, `depth` chunks in flight."""

    def __init__(self, n: int, chunk: int, depth: int = 3):
        self.n, self.chunk = n, chunk
        self.host = [torch.randn(n).pin_memory(), torch.zeros(n).pin_memory(), torch.zeros(n).pin_memory()]
        self.grad = torch.randn(n, device="cuda") * 1e-3  # the gradient never crosses PCIe on this route
        self.bufs = [[torch.empty(chunk, device="cuda") for _ in range(3)] for _ in range(depth)]
        self.bf16 = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        self.h2d, self.comp, self.d2h = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
        self.step = torch.tensor(1.0, device="cuda")

    def run(self) -> None:
        depth = len(self.bufs)
        freed = [None] * depth  # event: buffer set i was copied out and may be filled again
        for k, lo in enumerate(range(0, self.n, self.chunk)):
            hi = min(self.n, lo + self.chunk)
            i = k % depth
            p, m, v = (b[: hi - lo] for b in self.bufs[i])
            with torch.cuda.stream(self.h2d):
                if freed[i] is not None:
                    self.h2d.wait_event(freed[i])
                for dst, src in zip((p, m, v), self.host):
                    dst.copy_(src[lo:hi], non_blocking=True)
                landed = torch.cuda.Event()
                landed.record()
            with torch.cuda.stream(self.comp):
                self.comp.wait_event(landed)
                torch._fused_adamw_([p], [self.grad[lo:hi]], [m], [v], [], [self.step], lr=OPT.lr,
                                    beta1=OPT.betas[0], beta2=OPT.betas[1], weight_decay=OPT.weight_decay,
                                    eps=OPT.eps, amsgrad=False, maximize=False)
                self.bf16[lo:hi].copy_(p)
                done = torch.cuda.Event()
                done.record()
            with torch.cuda.stream(self.d2h):
                self.d2h.wait_event(done)
                for dst, src in zip(self.host, (p, m, v)):
                    dst[lo:hi].copy_(src, non_blocking=True)
                freed[i] = torch.cuda.Event()
                freed[i].record()
        self.d2h.synchronize()


def dram(n: int, reps: int, emit) -> None:
    """The host's memory ceiling on shared-memory buffers."""
    a, b, c = (state_like(n) for _ in range(3))
    a.normal_(), b.normal_(), c.zero_()
    nb = n * 4
    t = median_s(lambda: a.sum(), reps)
    emit("dram_read", s=t, gbs=nb / t / GB)
    t = median_s(lambda: c.copy_(a), reps)
    emit("dram_copy", s=t, gbs=2 * nb / t / GB)
    t = median_s(lambda: torch.add(a, b, alpha=0.5, out=c), reps)
    emit("dram_triad", s=t, gbs=3 * nb / t / GB)


def host(n: int, reps: int, emit) -> None:
    """The host update as the engine runs it, with and without the bf16 delivery cast."""
    p, g, m, v, deliver = update_buffers(n)
    step = [0]

    def host_update(with_cast: bool) -> None:
        step[0] += 1
        update_shard_(p, g, m, v, deliver if with_cast else None, step[0], OPT.lr, OPT)

    t = median_s(lambda: host_update(True), reps)
    emit("host_update", s_per_1e9=t * 1e9 / n, gbs_34=34 * n / t / GB)
    t = median_s(lambda: host_update(False), reps)
    emit("host_adamw", s_per_1e9=t * 1e9 / n, gbs_28=28 * n / t / GB)


def pcie(reps: int, emit) -> None:
    """Page-locked copies of 1 GiB, each direction alone and both at once."""
    size = 1 << 28
    hp = [torch.empty(size).pin_memory() for _ in range(2)]
    dv = [torch.empty(size, device="cuda") for _ in range(2)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def copy(h2d: bool, d2h: bool) -> None:
        if h2d:
            with torch.cuda.stream(s1):
                dv[0].copy_(hp[0], non_blocking=True)
        if d2h:
            with torch.cuda.stream(s2):
                hp[1].copy_(dv[1], non_blocking=True)
        s1.synchronize()
        s2.synchronize()

    for name, h2d, d2h in (("pcie_h2d", True, False), ("pcie_d2h", False, True), ("pcie_both", True, True)):
        t = median_s(lambda: copy(h2d, d2h), reps)  # noqa: B023 - called before the loop moves on
        emit(name, s=t, gbs=(h2d + d2h) * size * 4 / t / GB)


def gpu_adamw(n: int, reps: int, emit) -> None:
    """The same fused fp32 AdamW on tensors resident in HBM."""
    gp, gg, gm, gv = (torch.randn(n, device="cuda") for _ in range(4))
    gm.zero_(), gv.abs_()
    st = torch.tensor(1.0, device="cuda")

    def run() -> None:
        torch._fused_adamw_([gp], [gg], [gm], [gv], [], [st], lr=OPT.lr, beta1=OPT.betas[0],
                            beta2=OPT.betas[1], weight_decay=OPT.weight_decay, eps=OPT.eps, amsgrad=False,
                            maximize=False)

    t = median_time(run, reps, cuda=True)
    emit("gpu_adamw", s_per_1e9=t * 1e9 / n, hbm_gbs_28=28 * n / t / GB)


def split(streamed: Streamed, share: float, threads: int, reps: int, emit) -> None:
    """The host updating `share` of the params in its own thread while the GPU streams the rest, from one start."""
    n = streamed.n
    host_n = int(n * share / (1 - share))
    hp, hg, hm, hv, hd = update_buffers(host_n)
    sides: dict[str, float] = {}

    def host_side() -> None:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        update_shard_(hp, hg, hm, hv, hd, 1, OPT.lr, OPT)
        sides["host"] = time.perf_counter() - t0

    def together() -> tuple[float, float, float]:
        worker = threading.Thread(target=host_side)
        t0 = time.perf_counter()
        worker.start()
        streamed.run()
        sides["gpu"] = time.perf_counter() - t0
        worker.join()
        return time.perf_counter() - t0, sides["host"], sides["gpu"]

    together()
    ts = [together() for _ in range(reps)]
    wall = statistics.median(x[0] for x in ts)
    emit(f"split_{share:g}", host_params=host_n, gpu_params=n, s_per_1e9=wall * 1e9 / (host_n + n),
         host_s=statistics.median(x[1] for x in ts), gpu_s=statistics.median(x[2] for x in ts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--numel", type=int, default=1 << 28, help="params per host buffer")
    ap.add_argument("--chunk", type=int, default=1 << 24, help="params per streamed chunk")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--splits", default="0.3,0.4,0.5,0.6")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, reps = args.numel, args.reps
    rows: list[dict] = []

    def emit(name: str, **fields) -> None:
        row = {"name": name, **{k: round(v, 4) if isinstance(v, float) else v for k, v in fields.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)

    dram(n, reps, emit)
    host(n, reps, emit)
    if torch.cuda.is_available():
        pcie(reps, emit)
        gpu_adamw(n, reps, emit)
        streamed = Streamed(n, args.chunk)
        t = median_s(streamed.run, reps)
        emit("gpu_streamed", s_per_1e9=t * 1e9 / n, pcie_gbs=24 * n / t / GB)
        for share in (float(x) for x in args.splits.split(",")):
            split(streamed, share, args.threads, reps, emit)
    _finish(rows, args.out)


def _finish(rows: list[dict], out: str | None) -> None:
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    print("\n".join(f"{r['name']:<14} " + " ".join(f"{k}={v}" for k, v in r.items() if k != "name") for r in rows))


if __name__ == "__main__":
    main()
