"""How fast this host hands out fresh shared-memory pages: what bounds paging in the AdamW moments (MomentPager).

    PYTHONPATH=runtime python3 scripts/probe_paging.py --gib 32 --threads 16 --files 1,4,16 [--out FILE]

For each file count, GIB of fresh files in /dev/shm (holes, as HostState maps fresh moments) are paged in on
THREADS threads in 64 MB pieces, once by the kernel in bulk (madvise MADV_POPULATE_WRITE, the pager's default)
and once by writing zeros (the pager's `zero` mode), each into new files. One JSON line per run: seconds and
GB/s. If the rate grows with the file count, one file's page cache is the bottleneck, not the memory."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
from slidedp.step.host_fill import PAGE_CHUNK, parallel_for
from slidedp.step.host_state import MADV_POPULATE_WRITE, populate


def page_in(files: int, nbytes: int, threads: int, mode: str, directory: str) -> float:
    per = nbytes // files // 4
    tensors, paths = [], []
    for k in range(files):
        path = os.path.join(directory, f"slidedp-probe-paging-{os.getpid()}-{k}")
        with open(path, "wb") as fh:
            fh.truncate(per * 4)
        paths.append(path)
        tensors.append(torch.from_file(path, shared=True, size=per, dtype=torch.float32))
    per_file = [[(t, lo, min(lo + PAGE_CHUNK, per)) for lo in range(0, per, PAGE_CHUNK)] for t in tensors]
    pieces = [p for group in itertools.zip_longest(*per_file) for p in group if p is not None]  # files in turn

    def work(piece) -> None:
        t, lo, hi = piece
        if mode == "populate":
            err = populate(t.data_ptr() + lo * 4, (hi - lo) * 4, MADV_POPULATE_WRITE)
            if err:
                raise OSError(err, os.strerror(err))
        else:
            t[lo:hi].zero_()

    try:
        t0 = time.perf_counter()
        parallel_for(pieces, work, threads)
        return time.perf_counter() - t0
    finally:
        del tensors, pieces
        for path in paths:
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=32.0)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--files", default="1,4,16", help="comma-separated file counts")
    p.add_argument("--modes", default="populate,zero")
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    nbytes = int(a.gib * 2**30)
    page_in(1, min(nbytes, 2**30), a.threads, "zero", a.dir)  # the first pages a process asks for cost more
    for files in (int(f) for f in a.files.split(",")):
        for mode in a.modes.split(","):
            s = page_in(files, nbytes, a.threads, mode, a.dir)
            row = {"files": files, "mode": mode, "gib": a.gib, "threads": a.threads, "s": round(s, 3),
                   "gb_per_s": round(nbytes / s / 1e9, 2)}
            print(json.dumps(row), flush=True)
            if a.out:
                with open(a.out, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
