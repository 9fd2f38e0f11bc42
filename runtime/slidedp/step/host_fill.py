"""Filling the host state before the first step, on every core: the fp32 master weights of each unit (random
initial weights, or a local checkpoint's tensors) and its bf16 delivery copy.

Units are independent. Each unit's random weights come from its own generator (ModelAdapter.init_unit seeds it
from the job's seed and the unit's index) and each loaded unit from its own tensors, so filling the units in any
order, on any number of threads, writes the same bytes as filling them one after the other. torch releases the
GIL inside its kernels, so threads are enough. The thread that fills a unit also makes its delivery copy, while
the unit is still in cache, and the largest units (embedding, head) start first, since they bound the fill.

The fill mostly writes pages the kernel hands out zeroed on first touch (fresh shared-memory files), which scales
with cores until memory bandwidth runs out: one thread per core this process may run on, at most MAX_THREADS,
each running torch's kernels on one thread so the workers do not fight over the cores.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager

import torch
from slidedp.step.host_state import MADV_POPULATE_WRITE, populate

MAX_THREADS = 32  # past this, memory bandwidth, not cores, bounds writing the state
PROGRESS_POLL_S = 0.5  # how often the calling thread wakes to report progress


def available_cores() -> int:
    """Cores this process may run on (its affinity, as a container or taskset sets it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fill_threads(items: int, cores: int | None = None) -> int:
    """Threads for filling `items` independent pieces: one per core, no more than pieces or MAX_THREADS."""
    return max(1, min(cores or available_cores(), items, MAX_THREADS))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch's intra-op kernels on n threads inside the block (threads started in it inherit n)."""
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def parallel_for(items: Iterable, work: Callable[[object], None], threads: int,
                 progress: Callable[[int, int], None] | None = None) -> None:
    """work(item) for every item, on `threads` threads in the order given; the first error is raised once the
    running items have finished (the rest are not started).

    progress(done, total) is called from the calling thread only, before any item finishes and then every
    PROGRESS_POLL_S while items remain (never with done == total: the caller's next stage says it is over).
    With one thread everything runs in the calling thread, as a plain loop."""
    items = list(items)
    total = len(items)
    if threads <= 1 or total <= 1:
        for done, item in enumerate(items):
            if progress is not None:
                progress(done, total)
            work(item)
        return
    cores = available_cores()
    with torch_threads(max(1, cores // threads)):
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="slidedp-fill")
        try:
            pending = {pool.submit(work, item) for item in items}
            while pending:
                if progress is not None:
                    progress(total - len(pending), total)
                finished, pending = wait(pending, timeout=PROGRESS_POLL_S, return_when=FIRST_EXCEPTION)
                for f in finished:
                    if f.exception() is not None:
                        raise f.exception()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def fill_host_state(adapter, state, seed: int, model_dir: str | None = None,
                    progress: Callable[[int, int], None] | None = None, threads: int | None = None) -> None:
    """Fill a fresh host state: every unit's master weights, from the checkpoint in model_dir (a local Hugging
    Face directory of safetensors, read tensor by tensor, never a whole file) or drawn from `seed`, then its bf16
    delivery copy. threads: None for one per core (fill_threads); the weights do not depend on it."""
    from slidedp.step.model_adapter import checkpoint_index

    index = checkpoint_index(model_dir) if model_dir is not None else None
    copy = state.delivery is not state.master

    def fill_unit(u: int) -> None:
        spec = adapter.units[u]
        flat = state.master_unit(u)
        if index is not None:
            adapter.load_unit(spec, flat, model_dir, index)
        else:
            adapter.init_unit(spec, flat, seed)
        if copy:
            state.delivery_unit(u).copy_(flat)

    order = sorted(range(len(adapter.units)), key=lambda u: -adapter.units[u].numel)
    parallel_for(order, fill_unit, threads or fill_threads(len(order)), progress)


PAGE_CHUNK = 1 << 24  # elements per piece of paging in (64 MB of fp32)
PAGING_MODES = ("populate", "zero")


class MomentPager(threading.Thread):
    """Page in fresh AdamW moments in the background while the ranks start.

    Fresh moments are holes that read as zero (HostState), so the first step's update would fault in 8 B/param
    of pages itself, inside the step (for Qwen3-8B 65.5 GB, at the rate the fill writes fresh pages). This thread
    has them allocated once, on `threads` threads, while the ranks are still starting. It begins once every rank
    has page-locked the state (Board.all_pinned): page-locking beside the paging is many times slower (Qwen3-8B
    on the GPU machine: 17-25 s against about 1.3 s alone).

    mode `populate` (Linux 5.14+): the kernel allocates each piece's zeroed pages in bulk (madvise
    MADV_POPULATE_WRITE), without a fault per page and without writing anything: a page an update has already
    written keeps its bytes, so the updaters need not wait and the first step's update runs beside the paging,
    faulting in only the pages it reaches first. Board.MOMENTS_PAGING stays 0 unless the paging fails (2). Where
    the kernel lacks the advice (checked on the first page at construction) the mode falls back to `zero`.

    mode `zero`: the pages are written with zeros. An update must not race those zeros, so Board.MOMENTS_PAGING
    is 1 from construction (before the ranks may read the state) until they are paged in (0), or 2 if that failed,
    and each rank's updater waits for it before its first update.

    Only for moments no one has written: a resumed or kept state already holds its moments."""

    def __init__(self, tensors: list[torch.Tensor], board, threads: int | None = None, mode: str = "populate",
                 stripe_bytes: int | None = None):
        super().__init__(name="slidedp-moment-pager", daemon=True)
        if mode not in PAGING_MODES:
            raise ValueError(f"paging mode must be one of {PAGING_MODES}, got {mode!r}")
        pieces = [(i, lo) for i, t in enumerate(tensors) for lo in range(0, t.numel(), PAGE_CHUNK)]
        if stripe_bytes:  # one file per stripe_bytes (HostLayout.files): the threads' next pieces in other files
            pieces.sort(key=lambda p: ((p[1] * tensors[p[0]].element_size()) % stripe_bytes, p))
        self.pieces = [(tensors[i], lo, min(lo + PAGE_CHUNK, tensors[i].numel())) for i, lo in pieces]
        if mode == "populate" and self.pieces:
            t = self.pieces[0][0]  # one page: EINVAL where the kernel does not know the advice
            if populate(t.data_ptr(), min(4096, t.numel() * t.element_size()), MADV_POPULATE_WRITE) != 0:
                mode = "zero"
        self.mode = mode
        self.board = board
        self.threads = threads or fill_threads(len(self.pieces))
        self.elapsed_s: float | None = None  # set once paged in (from the start of paging)
        self.waited_s: float | None = None  # for the ranks to page-lock the state, before paging
        self.error: BaseException | None = None
        self._halt = threading.Event()
        board.set(board.MOMENTS_PAGING, 1 if mode == "zero" else 0)

    def page_piece(self, piece: tuple[torch.Tensor, int, int]) -> None:
        if self._halt.is_set():
            return
        t, lo, hi = piece
        if self.mode == "zero":
            t[lo:hi].zero_()
            return
        size = t.element_size()
        for _ in range(100):  # EINTR / EAGAIN: a signal or a transient shortage; the pages done stay done
            err = populate(t.data_ptr() + lo * size, (hi - lo) * size, MADV_POPULATE_WRITE)
            if err not in (errno.EINTR, errno.EAGAIN):
                break
        if err != 0:
            raise OSError(err, os.strerror(err))

    def run(self) -> None:
        t0 = time.perf_counter()
        while not self.board.all_pinned():
            if self._halt.wait(0.005):  # the run is ending (a rank failed, or a stop) before it began
                return
        self.waited_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            parallel_for(self.pieces, self.page_piece, self.threads)
        except BaseException as exc:  # the updaters are told, and fail their run with the board's word
            self.error = exc
            self.board.set(self.board.MOMENTS_PAGING, 2)
            return
        self.elapsed_s = time.perf_counter() - t0
        self.board.set(self.board.MOMENTS_PAGING, 0)

    def close(self) -> None:
        """Stop after the pieces already started and wait for them (before the state is unmapped)."""
        self._halt.set()
        if self.is_alive():
            self.join()
