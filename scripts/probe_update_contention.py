"""What slows the host update inside a training step? Time the engine's host update (AdamW and the bf16 cast) on shared-memory buffers under
each kind of concurrent GPU activity, one at a time.

    PYTHONPATH=runtime python3 scripts/probe_update_contention.py --threads 16 --out update_contention.jsonl

The update runs in its own thread with its own OpenMP team, as the engine's updater does, over layer-sized chunks
(--chunk-m million params) of buffers mapped from /dev/shm like the host state. Conditions: nothing else; a GPU
busy with matrix products but copying nothing; H2D alone, D2H alone and both directions without pause; both
directions at a duty cycle (each copy followed by an idle gap, as a step's deliveries and gradients come in bursts).
Copies wait on blocking events, so no waiting thread spins on a core. Then a thread running Python without pause,
as the engine's issuing thread does (pure bytecode, or bytecode with a small CUDA launch every few dozen
microseconds), at CPython's default GIL switch interval and at the engine's: the update's thread needs the GIL back
after each GIL-free call. Each line: condition, update seconds per 1e9 params, DMA GB/s achieved while it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch
from slidedp.config import OptimizerConfig
from slidedp.planning.microbench import update_buffers
from slidedp.step.optimizer import update_shard_


class Background:
    """GPU activity in a thread of its own while the update is timed: `with Load(...) as load:`."""

    def __init__(self):
        self.stop = threading.Event()
        self.moved = 0  # bytes copied so far
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


class Dma(Background):
    """Copies between pinned host buffers and the GPU in one or both directions, at a duty cycle."""

    def __init__(self, nbytes: int, h2d: bool, d2h: bool, duty: float):
        super().__init__()
        self.h2d, self.d2h, self.duty = h2d, d2h, duty
        n = nbytes // 2
        self.host = [torch.empty(n, dtype=torch.bfloat16).pin_memory() for _ in range(2)]
        self.dev = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        self.streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            events = []
            if self.h2d:
                with torch.cuda.stream(self.streams[0]):
                    self.dev[0].copy_(self.host[0], non_blocking=True)
                    events.append(torch.cuda.Event(blocking=True))
                    events[-1].record()
            if self.d2h:
                with torch.cuda.stream(self.streams[1]):
                    self.host[1].copy_(self.dev[1], non_blocking=True)
                    events.append(torch.cuda.Event(blocking=True))
                    events[-1].record()
            for e in events:
                e.synchronize()
            self.moved += self.host[0].numel() * 2 * len(events)
            busy = time.perf_counter() - t0
            if self.duty < 1.0:
                time.sleep(busy * (1.0 / self.duty - 1.0))


class GemmLoad(Background):
    """The GPU computing (bf16 matrix products) while copying nothing: what the issuing thread's launches cost."""

    def __init__(self):
        super().__init__()
        self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def _run(self) -> None:
        while not self.stop.is_set():
            for _ in range(8):
                self.a @ self.a
            e = torch.cuda.Event(blocking=True)
            e.record()
            e.synchronize()


class PythonLoad(Background):
    """A thread holding the GIL between (optional) small launches, at a given switch interval."""

    def __init__(self, switch_s: float, launches: bool):
        super().__init__()
        self.switch_s, self.launches = switch_s, launches
        self.before = sys.getswitchinterval()
        self.x = torch.zeros(1024, device="cuda" if launches else "cpu")

    def _run(self) -> None:
        while not self.stop.is_set():
            for _ in range(200):
                sum(i * i for i in range(40))  # ~ tens of microseconds of bytecode, as a hook or a window step
                if self.launches:
                    self.x.add_(1.0)
            if self.launches:
                torch.cuda.synchronize()

    def __enter__(self):
        sys.setswitchinterval(self.switch_s)
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        sys.setswitchinterval(self.before)


def timed_update(bufs: dict, chunk: int, threads: int, passes: int) -> float:
    """Seconds per 1e9 params of the engine's host update (AdamW, then the bf16 cast) over the buffers in layer-sized chunks, in a thread of its own."""
    opt = OptimizerConfig()
    out: list[float] = []

    def run() -> None:
        torch.set_num_threads(threads)  # per calling thread, as the engine's updater sets it
        total = bufs["p"].numel()
        times = []
        for k in range(passes + 1):
            t0 = time.perf_counter()
            for lo in range(0, total, chunk):
                hi = min(total, lo + chunk)
                update_shard_(bufs["p"][lo:hi], bufs["g"][lo:hi], bufs["m"][lo:hi], bufs["v"][lo:hi],
                              bufs["d"][lo:hi], k + 1, 1e-5, opt)
            if k:  # the first pass warms up
                times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) * 1e9 / total)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--params-m", type=int, default=400, help="million fp32 params updated per pass")
    ap.add_argument("--chunk-m", type=int, default=50, help="million params per update call (a decoder layer)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--copy-mb", type=int, default=100, help="MB per copy and direction")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n = args.params_m * 1_000_000
    bufs = dict(zip("pgmvd", update_buffers(n)))  # mapped as the host state is; d: the bf16 copy
    chunk = args.chunk_m * 1_000_000
    cuda = torch.cuda.is_available()
    conditions = [("alone", None)]
    for switch in (0.005, 2e-4):
        conditions.append((f"python_busy_switch_{switch:g}", lambda s=switch: PythonLoad(s, False)))
    if cuda:
        nbytes = args.copy_mb * 1_000_000
        conditions += [
            ("gpu_compute_only", lambda: GemmLoad()),
            ("d2h_nonstop", lambda: Dma(nbytes, False, True, 1.0)),
            ("h2d_nonstop", lambda: Dma(nbytes, True, False, 1.0)),
            ("both_nonstop", lambda: Dma(nbytes, True, True, 1.0)),
            ("both_duty_0.5", lambda: Dma(nbytes, True, True, 0.5)),
            ("both_duty_0.3", lambda: Dma(nbytes, True, True, 0.3)),
            ("both_duty_0.1", lambda: Dma(nbytes, True, True, 0.1)),
            ("python_launches_switch_0.005", lambda: PythonLoad(0.005, True)),
            ("python_launches_switch_0.0002", lambda: PythonLoad(2e-4, True)),
            ("alone_again", None),
        ]
    lines = []
    for name, make in conditions:
        try:
            if make is None:
                row = {"condition": name, "update_s_per_1e9": timed_update(bufs, chunk, args.threads, args.passes),
                       "dma_GBps": 0.0}
            else:
                load = make()
                with load:
                    time.sleep(0.3)
                    m0, t0 = load.moved, time.perf_counter()
                    rate = timed_update(bufs, chunk, args.threads, args.passes)
                    gbps = (load.moved - m0) / (time.perf_counter() - t0) / 1e9
                row = {"condition": name, "update_s_per_1e9": rate, "dma_GBps": gbps}
        except Exception as exc:  # a probe: report the condition that failed and go on with the others
            row = {"condition": name, "error": repr(exc)}
        row.update(threads=args.threads, chunk_m=args.chunk_m, params_m=args.params_m)
        print(json.dumps(row), flush=True)
        lines.append(row)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            for row in lines:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
