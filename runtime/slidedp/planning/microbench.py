"""Host and link microbenchmarks for calibration: host update and copy rates by thread count, host DRAM shared
between the update and DMA, PCIe copies by chunk size, pinned allocation, and the device-side AdamW of the
embedding and head (policy.edge_update: gpu). Medians after warm-up."""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from slidedp.config import JobConfig, OptimizerConfig
from slidedp.planning.job import UPDATE_DRAM_BYTES
from slidedp.step.host_state import SHM_PREFIX, shm_dir
from slidedp.step.optimizer import adamw_, update_shard_

# the engine's own update call, timed with the hyperparameters that cost the same as any others
_BENCH_OPT = OptimizerConfig(lr=1e-6, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8)

MIB = 2**20


def compute_threads(cfg: JobConfig, topology: dict) -> int:
    from slidedp.planning.job import rank_threads

    return rank_threads(cfg, int(topology.get("cpu", {}).get("cores") or os.cpu_count() or 1))


# ---------------------------------------------------------------------------- timing helpers
def event_times(fn: Callable[[], Any], reps: int) -> list[float]:
    """Seconds of each of `reps` calls of fn on the current CUDA stream, between two timing events, each waited
    for before the next call."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def median_time(fn: Callable[[], Any], reps: int, cuda: bool, warmup: int = 1, window_s: float = 0.0) -> float:
    """The median time of fn() over reps runs after `warmup` (CUDA: with events). On the host, window_s > 0 runs
    it further until that many seconds are filled: the host figures of a step are sustained for seconds, and timed
    over three updates (a tenth of a second) host memory's capacity spread 7% over four runs on one host, over one
    second 1% (scripts/probe_host_dram.py, docs/planning.md "Prediction against measured steps")."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        return statistics.median(event_times(fn, reps))
    times = []
    end = time.perf_counter() + window_s
    while len(times) < reps or time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# host memory's figures (host_dram, update_in_step): each timed over at least this long
HOST_WINDOW_S = 1.0

SETTLE_BUDGET_S = 1.0  # a CPU figure that has not settled stops after this many seconds of reps (at least 3)


def settled(times: list[float], min_reps: int = 3, tol: float = 0.05) -> bool:
    """Whether a CPU timing has reps enough: at least min_reps, and the last one moved the median by less than
    `tol` of it, or the reps took SETTLE_BUDGET_S (a busy host's medians may never settle)."""
    if len(times) < max(2, min_reps):
        return False
    m = statistics.median(times)
    return abs(m - statistics.median(times[:-1])) <= tol * m or sum(times) >= SETTLE_BUDGET_S


def settled_median(fn: Callable[[], Any], max_reps: int, warmup: int = 1) -> float:
    """CPU timing: the median after warm-up, with reps only while they move it (settled), at most max_reps: a
    quiet host settles in three reps; a noisy one gets the reps its median needs."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < max(1, max_reps) and not settled(times):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---------------------------------------------------------------------------- host work
def state_like(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A buffer mapped as the engine maps its host state: a shared file in the state's directory (/dev/shm), not
    private anonymous memory. The kernel may back the latter with transparent huge pages and the former with 4 KiB
    pages, which made the same update 27% slower on a development machine: the engine's rate is the one to time.
    The file is removed at once (the mapping lives on), so a killed calibration leaves nothing behind."""
    path = os.path.join(shm_dir(), f"{SHM_PREFIX}calibration-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(path, "wb") as fh:
        fh.truncate(n * torch.empty((), dtype=dtype).element_size())
    try:
        t = torch.from_file(path, shared=True, size=n, dtype=dtype)
    finally:
        os.remove(path)
    return t


def update_buffers(n: int, cast: bool = True) -> tuple[torch.Tensor, ...]:
    """What the host update of n params works on, mapped as the host state is: the fp32 master and gradient
    (random), the two moments (zero: new files), and the bf16 delivery copy (None without the cast)."""
    p, g, m, v = (state_like(n) for _ in range(4))
    p.normal_()
    g.normal_()
    return p, g, m, v, (state_like(n, torch.bfloat16) if cast else None)


def thread_counts(cfg: JobConfig, topology: dict, cuda: bool = True) -> list[int]:
    """The thread counts the host rates are measured at. A CPU job's only: its rank's threads (the updater's,
    and a device-side update's in the rank's own thread) and every rank's together (cost_model.Rates.update_s,
    copy_s), never more than the cores the job has. A GPU job's also a quarter, half and all of the cores."""
    cores = int(topology.get("cpu", {}).get("cores") or os.cpu_count() or 1)
    per_rank = compute_threads(cfg, topology)
    counts = {per_rank, min(cores, per_rank * cfg.world_size)}
    if cuda:
        counts |= {cores, max(1, cores // 4), max(1, cores // 2)}
    return sorted(c for c in counts if c >= 1)


def cpu_rates(cfg: JobConfig, topology: dict, max_unit: int, quick: bool, cuda: bool) -> dict[str, Any]:
    """Seconds per 1e9 parameters of fused AdamW and of the engine's whole host update, and copy bandwidth
    (bytes read + written per second), by thread count. On CUDA on buffers larger than the caches; a CPU job's
    on its largest unit (at least 256 Ki and at most 2 Mi parameters), with reps while the median moves."""
    cap = (1 << 24) if quick else (1 << 25)
    n = max(1 << 20, min(cap, max_unit)) if cuda else max(1 << 18, min(1 << 21, max_unit))
    p, g, m, v, deliver = update_buffers(n)
    src, dst = torch.randn(n), torch.empty(n)
    reps = 3 if quick else 5

    def timed(fn: Callable[[], Any]) -> float:
        return median_time(fn, reps, False) if cuda else settled_median(fn, reps)

    def adamw() -> None:
        adamw_(p, g, m, v, 1, 1e-6, _BENCH_OPT)

    def update() -> None:  # what the engine runs per shard: AdamW and the bf16 delivery copy
        update_shard_(p, g, m, v, deliver if cfg.precision == "bf16" else None, 1, 1e-6, _BENCH_OPT)

    threads = thread_counts(cfg, topology, cuda)
    rows: dict[str, list[float]] = {"adamw_s_per_1e9": [], "update_s_per_1e9": [], "copy_GBps": []}
    for t in threads:
        torch.set_num_threads(t)
        rows["adamw_s_per_1e9"].append(timed(adamw) * 1e9 / n)
        rows["update_s_per_1e9"].append(timed(update) * 1e9 / n)
        rows["copy_GBps"].append(2 * 4 * n / timed(lambda: dst.copy_(src)) / 1e9)
    return {"threads": threads, "params": n, **rows}


def update_in_step(cfg: JobConfig, topology: dict, max_unit: int, load: Callable[[threading.Event], None],
                   load_name: str, params: int = 1 << 27, window_s: float = HOST_WINDOW_S) -> dict[str, Any]:
    """The host update as the step runs it: in a thread of its own with the rank's thread count, unit by unit
    (unit-sized chunks, each touched once per pass: nothing comes back warm from the caches), alone and while
    the calling thread runs `load` (the issuing thread's work: slidedp.planning.model_bench.issue_loop). The
    cost model scales its per-thread-count rates to the second figure: in the engine the update shares the cores
    with the thread that issues the forward and backward, and the rates of `cpu`, timed on one warm buffer with
    nothing else running, were 20-40% faster than the updater measured in steps."""
    threads = compute_threads(cfg, topology)
    n = params  # by default 128 Mi params, as host_dram: 2.5 GiB of state
    chunk = max(1, min(max_unit, n // 4))
    p, g, m, v, deliver = update_buffers(n, cast=cfg.precision == "bf16")
    bounds = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]

    def one_pass() -> None:
        for lo, hi in bounds:
            update_shard_(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], None if deliver is None else deliver[lo:hi], 1,
                          1e-6, _BENCH_OPT)

    def timed(out: list[Any]) -> None:
        try:
            torch.set_num_threads(threads)  # per calling thread, as the engine's updater sets it
            w0, c0 = time.perf_counter(), time.thread_time()
            rate = median_time(one_pass, 3, False, window_s=window_s) * 1e9 / n  # each pass ~0.03-0.08 s
            # the share of the wall time this thread (an OpenMP team member) was off the CPU, as the metrics
            # record's phases.update_offcpu measures it in the engine
            out.append((rate, max(0.0, 1.0 - (time.thread_time() - c0) / (time.perf_counter() - w0))))
        except BaseException as exc:  # re-raised in the calling thread
            out.append(exc)

    def in_thread(during: Callable[[threading.Event], None]) -> tuple[float, float]:
        out: list[Any] = []
        done = threading.Event()
        worker = threading.Thread(target=lambda: (timed(out), done.set()))
        worker.start()
        during(done)  # returns once the timing is over
        worker.join()
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    alone, alone_off = in_thread(lambda done: done.wait())
    beside, beside_off = in_thread(load)
    return {"threads": threads, "params": n, "chunk": chunk, "load": load_name, "alone_s_per_1e9": alone,
            "beside_load_s_per_1e9": beside, "offcpu_alone": alone_off, "offcpu_beside_load": beside_off,
            "cast": deliver is not None, "window_s": window_s}


def device_update(device: torch.device, dtype: torch.dtype, quick: bool) -> dict[str, Any]:
    """Seconds per 1e9 parameters of what slidedp.step.edge_update runs per shard on the GPU: fused AdamW on
    fp32 master and moments, then the copy into the unit's buffer in the compute dtype (HBM-bound)."""
    n = (1 << 25) if quick else (1 << 27)
    t = {"p": torch.randn(n, device=device), "g": torch.randn(n, device=device),
         "m": torch.zeros(n, device=device), "v": torch.zeros(n, device=device),
         "buf": torch.empty(n, dtype=dtype, device=device), "step": torch.tensor(1.0, device=device)}

    def run() -> None:
        torch._fused_adamw_([t["p"]], [t["g"]], [t["m"]], [t["v"]], [], [t["step"]], lr=1e-6, beta1=0.9,
                            beta2=0.95, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        t["buf"].copy_(t["p"])

    s = median_time(run, 3 if quick else 7, True, warmup=2)
    t.clear()
    torch.cuda.empty_cache()
    return {"params": n, "adamw_cast_s_per_1e9": s * 1e9 / n}


def host_dram(cfg: JobConfig, topology: dict, window_s: float = HOST_WINDOW_S) -> dict[str, Any]:
    """The host update alone and while every GPU copies both ways without pause, and the DMA rate alone and
    during the update: host DRAM is one resource for both (capacity = what both move together). Each figure is
    timed over window_s seconds at least (0: three updates, as calibrations before `window_s` was recorded did)."""
    ngpu = cfg.gpus
    threads = min(
        int(topology.get("cpu", {}).get("cores") or 1), compute_threads(cfg, topology) * cfg.world_size
    )
    torch.set_num_threads(threads)
    n = 1 << 27  # 128 Mi params: 2.5 GiB of state, far beyond the caches
    p, g, m, v, deliver = update_buffers(n)

    def update() -> None:
        update_shard_(p, g, m, v, deliver, 1, 1e-6, _BENCH_OPT)

    nbuf = 128 * MIB
    host = [torch.empty(nbuf, dtype=torch.uint8, pin_memory=True) for _ in range(2 * ngpu)]
    dev = [torch.empty(nbuf, dtype=torch.uint8, device=f"cuda:{i // 2}") for i in range(2 * ngpu)]
    stop = threading.Event()
    moved = [0] * ngpu

    def dma(i: int) -> None:
        # Waits on blocking events: a stream synchronize spins a core, and with the update's OpenMP team on every
        # core that spin stalled the team (the update measured 40x slower, 10.5 s per 1e9 params, on the GPU
        # machine), which is not the DRAM contention this measures.
        torch.cuda.set_device(i)
        s1, s2 = torch.cuda.Stream(i), torch.cuda.Stream(i)
        while not stop.is_set():
            done = [torch.cuda.Event(blocking=True), torch.cuda.Event(blocking=True)]
            with torch.cuda.stream(s1):
                dev[2 * i].copy_(host[2 * i], non_blocking=True)
                done[0].record(s1)
            with torch.cuda.stream(s2):
                host[2 * i + 1].copy_(dev[2 * i + 1], non_blocking=True)
                done[1].record(s2)
            done[0].synchronize()
            done[1].synchronize()
            moved[i] += 2 * nbuf

    alone = median_time(update, 3, False, window_s=window_s) * 1e9 / n
    workers = [threading.Thread(target=dma, args=(i,), daemon=True) for i in range(ngpu)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    m0, t0 = sum(moved), time.perf_counter()
    time.sleep(max(1.0, window_s))
    dma_alone = (sum(moved) - m0) / (time.perf_counter() - t0) / 1e9
    m0, t0 = sum(moved), time.perf_counter()
    together = median_time(update, 3, False, window_s=window_s) * 1e9 / n
    dma_with = (sum(moved) - m0) / (time.perf_counter() - t0) / 1e9
    stop.set()
    for w in workers:
        w.join()
    per_param = UPDATE_DRAM_BYTES[cfg.precision]
    return {
        "threads": threads,
        "update_alone_s_per_1e9": alone,
        "update_with_dma_s_per_1e9": together,
        "dma_alone_GBps": dma_alone,
        "dma_with_update_GBps": dma_with,
        "update_bytes_per_param": per_param,
        "capacity_GBps": per_param / together + dma_with,
        "window_s": window_s,
    }


# ---------------------------------------------------------------------------- PCIe
def transfers(ngpu: int, quick: bool) -> dict[str, Any]:
    chunks = [16, 64] if quick else [4, 16, 64, 256]
    total = (64 if quick else 256) * MIB
    hosts = [torch.empty(total, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    devs = [
        [torch.empty(total, dtype=torch.uint8, device=f"cuda:{i}") for _ in range(2)] for i in range(ngpu)
    ]
    streams = [(torch.cuda.Stream(i), torch.cuda.Stream(i)) for i in range(ngpu)]
    reps = 3 if quick else 5

    def copy(direction: str, gpus: list[int], chunk: int) -> float:
        """GB/s per GPU while `gpus` all copy `total` bytes in `chunk`-sized pieces."""

        def run() -> None:
            for i in gpus:
                s = streams[i][0 if direction == "h2d" else 1]
                with torch.cuda.stream(s):
                    for a in range(0, total, chunk):
                        if direction == "h2d":
                            devs[i][0][a : a + chunk].copy_(hosts[0][a : a + chunk], non_blocking=True)
                        else:
                            hosts[1][a : a + chunk].copy_(devs[i][1][a : a + chunk], non_blocking=True)
            for i in gpus:
                streams[i][0 if direction == "h2d" else 1].synchronize()

        run()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        return total / statistics.median(times) / 1e9

    out: dict[str, Any] = {"chunk_mib": chunks}
    for d in ("h2d", "d2h"):
        out[f"{d}_GBps"] = [copy(d, [0], c * MIB) for c in chunks]
        if ngpu > 1:
            out[f"{d}_all_GBps"] = [copy(d, list(range(ngpu)), c * MIB) for c in chunks]
    out["per_gpu"] = [
        {
            "gpu": i,
            "h2d_GBps": copy("h2d", [i], chunks[-1] * MIB),
            "d2h_GBps": copy("d2h", [i], chunks[-1] * MIB),
        }
        for i in range(ngpu)
    ]

    def both() -> None:
        with torch.cuda.stream(streams[0][0]):
            devs[0][0].copy_(hosts[0], non_blocking=True)
        with torch.cuda.stream(streams[0][1]):
            hosts[1].copy_(devs[0][1], non_blocking=True)
        streams[0][0].synchronize()
        streams[0][1].synchronize()

    both()
    t = time.perf_counter()
    for _ in range(reps):
        both()
    out["bidir_GBps"] = 2 * total * reps / (time.perf_counter() - t) / 1e9
    tiny_h, tiny_d = (
        torch.empty(4096, dtype=torch.uint8, pin_memory=True),
        torch.empty(4096, dtype=torch.uint8, device="cuda:0"),
    )

    def tiny() -> None:
        tiny_d.copy_(tiny_h, non_blocking=True)
        torch.cuda.current_stream().synchronize()

    out["latency_s"] = median_time(tiny, 20, False)
    return out


def pinned_alloc(quick: bool) -> float:
    nbytes = (64 if quick else 512) * MIB
    t = time.perf_counter()
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dt = time.perf_counter() - t
    del buf
    return dt * 2**30 / nbytes


# ---------------------------------------------------------------------------- the delivery cast beside compute
CAST_CHUNKS_MB = (16, 64, 256)  # the transfer chunks AutoPolicy tries (planning/knobs.CHUNKS_MB)
CAST_RING_MB = 256  # the cast scratch AutoPolicy tries (policy.cast_scratch_mb)
CAST_MAX_FORWARDS = 256  # a layer so small that more would be needed is launch-bound: its cast meets no long kernel


def delivery_cast(device: torch.device, numel: int, compute: Callable[[], None], reps: int = 5) -> dict[str, Any]:
    """One decoder layer's delivery with the bf16 cast on the GPU (delivery_cast: gpu), through the engine's own
    Routes.deliver, alone and while the compute stream runs the job's layer (`compute`, one forward): the default
    cast at each transfer chunk AutoPolicy tries, and the cast through CAST_RING_MB of scratch at 64 MiB chunks.

    The default cast copies a chunk into one scratch buffer and casts it there on the copy stream, so the next
    chunk's copy waits for a cast kernel, which waits for the compute kernel running: beside a layer's GEMMs the
    delivery runs below the link's rate (docs/planning.md, "Prediction against measured steps"). The forward is
    issued right behind the delivery, enough of it to cover the delivery twice over, and the delivery is timed with
    events on its own stream; each figure is the median of `reps`."""
    from slidedp.step.devices import Streams
    from slidedp.step.routes import Routes, ShardMap

    streams = Streams(device)
    host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
    host.normal_()
    buf = torch.empty(numel, dtype=torch.bfloat16, device=device)
    compute()
    torch.cuda.synchronize(device)
    fwd_s = statistics.median(event_times(compute, 3))

    def deliver(routes: Routes, beside: int) -> float:
        free = streams.record(streams.compute)
        start, ready = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with streams.on(streams.h2d):
            start.record(streams.h2d)
        routes.deliver(0, host, buf, free, ready)
        for _ in range(beside):  # issued right after the delivery's few calls: the GPU runs both from its start
            compute()
        torch.cuda.synchronize(device)
        return start.elapsed_time(ready) / 1e3

    def figures(chunk_mb: int, scratch_mb: int) -> dict[str, float]:
        routes = Routes("replicated", "host", ShardMap([numel], 1, 0), streams, None, None, chunk_mb * MIB,
                        scratch_mb * MIB)
        deliver(routes, 0)
        alone = statistics.median(deliver(routes, 0) for _ in range(reps))
        beside = min(CAST_MAX_FORWARDS, 1 + int(2 * alone / max(fwd_s, 1e-6)))
        return {"alone_s": alone, "beside_s": statistics.median(deliver(routes, beside) for _ in range(reps)),
                "forwards": beside}

    out: dict[str, Any] = {
        "params": numel,
        "bytes": numel * host.element_size(),
        "forward_s": fwd_s,
        "chunk_mib": list(CAST_CHUNKS_MB),
        "default": [figures(c, 0) for c in CAST_CHUNKS_MB],
        "ring_mib": CAST_RING_MB,
        "ring_chunk_mib": 64,
        "ring": figures(64, CAST_RING_MB),
    }
    return out
