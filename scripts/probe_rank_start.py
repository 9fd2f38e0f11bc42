"""Where a rank's start waits: page-locking a filled shared-memory state (what HostState.pin does) against loading
the model's config and adapter (what a rank loads beside it), in one process as a rank runs them.

    PYTHONPATH=runtime python3 scripts/probe_rank_start.py --mode overlap --gib 32 [--out FILE]
    PYTHONPATH=runtime python3 scripts/probe_rank_start.py --mode serial --gib 32 [--out FILE]
    PYTHONPATH=runtime python3 scripts/probe_rank_start.py --mode other --gib 16 [--out FILE]

Run each mode in a fresh process (the load is mostly first imports). In overlap mode a sampler records where the
loading thread is every 0.1 s while the page-lock runs, so a wait on a lock the page-lock holds shows as the frames
it sits in. Then the same memory is page-locked again with 1 and with 16 threads (does registering scale?).
Prints JSON lines: the fill, each page-lock, the load, and the sampled frames (most seen first).

--mode other: as a rank finds it, the memory filled by another process (a child fills two files and exits),
then one file page-locked as it is and the other after populating this process's page tables in bulk
(madvise MADV_POPULATE_READ, which maps up to 16 pages of a shared file per fault) — does page-locking pages
another process wrote cost their faults one by one?
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

import torch


def _load(model: str) -> None:
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    ModelAdapter(load_hf_config(model))


def _frames(ident: int, depth: int = 4) -> str:
    frame = sys._current_frames().get(ident)
    out = []
    while frame is not None and len(out) < depth:
        out.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(out)


def _other(a, emit) -> None:
    """Two files filled by a child process; one page-locked as found, the other populated first."""
    import subprocess

    from slidedp.step.host_state import _register, pin_ranges, populate

    n = int(a.gib * 2**30) // 4
    paths = [f"/dev/shm/slidedp-probe-{os.getpid()}-{k}" for k in ("plain", "populated")]
    fill = ("import sys, torch; torch.set_num_threads(16)\n"
            "for p in sys.argv[2:]:\n"
            "    open(p, 'wb').truncate(int(sys.argv[1]) * 4)\n"
            "    torch.from_file(p, shared=True, size=int(sys.argv[1]), dtype=torch.float32).fill_(0.5)\n")
    try:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", fill, str(n), *paths], check=True)
        emit({"part": "fill_in_child", "s": round(time.perf_counter() - t, 3), "gb": round(2 * n * 4 / 1e9, 2)})
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")
        cudart = torch.cuda.cudart()
        nbytes = n * 4
        ranges = pin_ranges(list(range(0, nbytes, 190 * 2**20 * 4)), nbytes)
        for path in paths:
            flat = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
            populate_s = err = None
            if path.endswith("populated"):
                t = time.perf_counter()
                err = populate(flat.data_ptr(), nbytes)
                populate_s = round(time.perf_counter() - t, 3)
            t = time.perf_counter()
            ptrs = _register(flat.data_ptr(), ranges, a.threads)
            emit({"part": "page_lock_other_process", "populated_first": populate_s is not None,
                  "populate_s": populate_s, "populate_errno": err, "threads": a.threads,
                  "s": round(time.perf_counter() - t, 3)})
            for p in ptrs:
                cudart.cudaHostUnregister(p)
            del flat
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


def main() -> None:
    from slidedp.step.host_state import _register, pin_ranges

    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("overlap", "serial", "other"), required=True)
    ap.add_argument("--gib", type=float, default=32)
    ap.add_argument("--threads", type=int, default=8, help="page-lock threads, as a rank uses (slidedp.step.host_state.PIN_THREADS)")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows: list[dict] = []

    def emit(row: dict) -> None:
        row = {"mode": a.mode, **row}
        rows.append(row)
        print(json.dumps(row), flush=True)

    if a.mode == "other":
        _other(a, emit)
        _append(a.out, rows)
        return
    n = int(a.gib * 2**30) // 4
    path = f"/dev/shm/slidedp-probe-{os.getpid()}"
    with open(path, "wb") as fh:
        fh.truncate(n * 4)
    try:
        flat = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
        torch.set_num_threads(16)
        t = time.perf_counter()
        flat.fill_(0.5)
        emit({"part": "fill", "s": round(time.perf_counter() - t, 3), "gb": round(n * 4 / 1e9, 2)})
        torch.set_num_threads(1)
        t = time.perf_counter()
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")
        emit({"part": "cuda_start", "s": round(time.perf_counter() - t, 3)})

        nbytes = n * 4
        unit = 190 * 2**20 * 4  # about one Qwen3-8B layer of fp32
        ranges = pin_ranges(list(range(0, nbytes, unit)), nbytes)
        seen: collections.Counter = collections.Counter()
        load_s: dict = {}

        def load() -> None:
            t0 = time.perf_counter()
            _load(a.model)
            load_s["s"] = time.perf_counter() - t0

        loader = None
        if a.mode == "overlap":
            loader = threading.Thread(target=load, name="probe-loading")
            loader.start()
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                if loader is not None and loader.is_alive():
                    seen[_frames(loader.ident)] += 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t = time.perf_counter()
        ptrs = _register(flat.data_ptr(), ranges, a.threads)
        emit({"part": "page_lock", "threads": a.threads, "ranges": len(ranges), "s": round(time.perf_counter() - t, 3),
              "loading_done": bool(load_s)})
        if loader is None:
            load()
        else:
            t = time.perf_counter()
            loader.join()
            emit({"part": "waited_for_load", "s": round(time.perf_counter() - t, 3)})
        stop.set()
        emit({"part": "load", "s": round(load_s["s"], 3)})
        emit({"part": "frames", "top": seen.most_common(12)})
        cudart = torch.cuda.cudart()
        t = time.perf_counter()
        for p in ptrs:
            cudart.cudaHostUnregister(p)
        emit({"part": "unregister", "s": round(time.perf_counter() - t, 3)})
        for threads, rr in ((1, [(0, nbytes)]), (16, ranges)):
            t = time.perf_counter()
            ptrs = _register(flat.data_ptr(), rr, threads)
            emit({"part": "page_lock_again", "threads": threads, "ranges": len(rr), "s": round(time.perf_counter() - t, 3)})
            for p in ptrs:
                cudart.cudaHostUnregister(p)
    finally:
        os.unlink(path)
    _append(a.out, rows)


def _append(path: str | None, rows: list[dict]) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
