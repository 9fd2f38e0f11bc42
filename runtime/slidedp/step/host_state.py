"""The host state: the one authoritative copy of the model and its optimizer, shared by every rank process.

fp32 master weights and AdamW moments (12 B/param) plus, in bf16 precision, the bf16 delivery copy (2 B/param)
live in shared-memory files mapped by all rank processes: one copy per host whatever the number of ranks. Its
layout is one flat array per kind with every unit at a fixed offset; how parameters and gradients travel (the
routes) does not change it. On CUDA the delivery copy and the gradient staging are page-locked once with
cudaHostRegister in each rank (pageable H2D runs at 7.6 GB/s against 54.7 GB/s pinned on our GPU machine, and
pinning 8 GiB costs 4.5 s, so it is done once at start and reused).

Shared memory outlives a killed process, so segments are named per run and listed in a manifest holding the
owner's pid; `cleanup_orphans` removes segments of runs whose owner is gone, and the owner unlinks its own at exit.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict

import torch
from slidedp.step.layout import SHM_PREFIX, HostLayout, pid_alive, shm_dir

__all__ = ["SHM_PREFIX", "Board", "HostLayout", "HostState", "cleanup_orphans", "shm_dir", "space_error", "unlink"]


def cleanup_orphans(directory: str | None = None) -> list[str]:
    """Remove the segments of runs whose owning process no longer exists; returns the removed paths."""
    directory = directory or shm_dir()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if not (name.startswith(SHM_PREFIX) and name.endswith(".manifest.json")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as fh:
                owner = int(json.load(fh)["owner_pid"])
        except (OSError, ValueError, KeyError):
            continue
        if pid_alive(owner):
            continue
        run = name[: -len(".manifest.json")]
        for other in names:
            if other.startswith(run + ".") or other == name:
                try:
                    os.unlink(os.path.join(directory, other))
                    removed.append(os.path.join(directory, other))
                except FileNotFoundError:
                    pass
    return removed


PIN_RANGE_BYTES = 1 << 30  # smallest range of the delivery copy registered on its own


def pin_ranges(unit_offsets: list[int], nbytes: int, page: int | None = None,
               min_bytes: int = PIN_RANGE_BYTES) -> list[tuple[int, int]]:
    """Byte ranges [start, end) covering [0, nbytes) to page-lock separately: each starts where a unit starts
    (a copy of a unit never spans two registrations) and on a page boundary (two registrations never share a
    page), and holds at least min_bytes but the last. One range when no unit start qualifies."""
    page = page or os.sysconf("SC_PAGE_SIZE")
    ranges, start = [], 0
    for off in unit_offsets:
        if off - start >= min_bytes and off % page == 0 and nbytes - off >= min_bytes:
            ranges.append((start, off))
            start = off
    ranges.append((start, nbytes))
    return ranges


def split_at(base: int, numel: int, size: int, edges) -> list[tuple[int, int]]:
    """[0, numel) split into element ranges at every address in `edges` inside the `size`-byte elements from
    `base`; [(0, numel)] when none falls inside."""
    cuts = sorted((e - base) // size for e in edges if base < e < base + numel * size)
    bounds = [0, *cuts, numel]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


MADV_POPULATE_READ = 22  # Linux 5.14+: map a range's pages now, as read faults would
MADV_POPULATE_WRITE = 23  # ... as write faults would: a hole of a shared file gets its zeroed pages allocated


def populate(base: int, nbytes: int, advice: int = MADV_POPULATE_READ) -> int:
    """Map the pages of [base, base + nbytes) into this process's page tables in bulk (madvise
    MADV_POPULATE_READ: a read fault on a shared file maps up to 16 present pages at once; MADV_POPULATE_WRITE
    allocates the pages of a hole as well); returns 0 or the errno (EINVAL before Linux 5.14, where page-locking
    then faults the pages in itself, as before)."""
    import ctypes

    return 0 if _libc().madvise(base, nbytes, advice) == 0 else ctypes.get_errno()


def _register(base: int, ranges: list[tuple[int, int]], threads: int, populate_first: int | None = None) -> list[int]:
    """cudaHostRegister each byte range of the memory at `base`, on up to `threads` threads; returns the address
    of each range (what cudaHostUnregister takes). When one fails, those registered are unregistered again.
    populate_first: the madvise advice to map each range's pages with in bulk before registering it
    (`populate`), None for none."""
    from concurrent.futures import ThreadPoolExecutor

    cudart = torch.cuda.cudart()
    device = torch.cuda.current_device()
    done: list[int] = []

    def register(r: tuple[int, int]) -> None:
        torch.cuda.set_device(device)  # a new thread starts on device 0: register with the rank's device current
        if populate_first is not None:
            populate(base + r[0], r[1] - r[0], populate_first)
        err = cudart.cudaHostRegister(base + r[0], r[1] - r[0], 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed ({err}) for {r[1] - r[0]} bytes")
        done.append(base + r[0])

    try:
        if len(ranges) == 1 or threads <= 1:
            for r in ranges:
                register(r)
        else:
            with ThreadPoolExecutor(min(threads, len(ranges)), thread_name_prefix="slidedp-pin") as pool:
                list(pool.map(register, ranges))
    except BaseException:
        for ptr in done:
            cudart.cudaHostUnregister(ptr)
        raise
    return done


# Threads that page-lock a segment, each registering its own ranges with CUDA (HostState.pin).
PIN_THREADS = 8


def _map(layout: HostLayout, kind: str, numel: int, dtype: torch.dtype, create: bool) -> torch.Tensor:
    """A segment as one flat tensor. Up to layout.stripe_bytes it is one file; a larger one is several files
    mapped back to back into one reserved range (`_map_striped`), so that filling it on many cores does not wait
    on one file's page allocation. create: new files (an existing one under the name is emptied), each a hole:
    every page reads as zero until someone writes it, and is only allocated then."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    files = layout.files(kind, nbytes)
    if create:
        for path, size in files:
            with open(path, "wb") as fh:
                fh.truncate(max(size, 1))
    if len(files) == 1:
        return torch.from_file(files[0][0], shared=True, size=numel, dtype=dtype)
    return torch.frombuffer(_map_striped(files, nbytes), dtype=dtype, count=numel)


_PROT_NONE, _PROT_RW, _MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = (
    0, 0x1 | 0x2, 0x01, 0x02, 0x10, 0x20, 0x4000)


@functools.cache
def _libc():
    """This process's C library with the signatures of the calls made here (madvise, mmap, munmap)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _map_striped(files: list[tuple[str, int]], nbytes: int):
    """Map the files back to back, shared, into one range reserved for them; returns a writable buffer over the
    range that unmaps it when the last reference to it (the tensor's storage) is gone."""
    import ctypes
    import weakref

    libc = _libc()
    failed = ctypes.c_void_p(-1).value
    base = libc.mmap(None, nbytes, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if base in (None, failed):
        err = ctypes.get_errno()
        raise OSError(err, f"reserving {nbytes} bytes of address space for the host state: {os.strerror(err)}")
    try:
        at = base
        for path, size in files:
            fd = os.open(path, os.O_RDWR)
            try:
                got = libc.mmap(at, size, _PROT_RW, _MAP_SHARED | _MAP_FIXED, fd, 0)
            finally:
                os.close(fd)
            if got != at:
                err = ctypes.get_errno()
                raise OSError(err, f"mapping {path}: {os.strerror(err)}")
            at += size
    except BaseException:
        libc.munmap(base, nbytes)
        raise
    buf = (ctypes.c_uint8 * nbytes).from_address(base)
    # not at exit: a daemon thread (the updater) may still be reading the range while the interpreter ends, and
    # the process's end unmaps it anyway
    weakref.finalize(buf, libc.munmap, base, nbytes).atexit = False
    return buf


def space_error(layout: HostLayout, keep_state: bool = False) -> dict[str, str] | None:
    """The config error to refuse a run with when its segments do not fit their folder, else None."""
    from slidedp import host_memory

    need, free = layout.shared_bytes(keep_state), host_memory.free_bytes(layout.directory)
    if free is None or need <= free:
        return None
    gib = 2**30
    return {"loc": "model", "msg": f"shared memory too small: the host state needs {need / gib:.1f} GiB in "
            f"{layout.directory} but only {free / gib:.1f} GiB is free there; enlarge that tmpfs (mount -o "
            f"remount,size={-(-need // gib) + 1}g {layout.directory}), in Docker give the container a larger shm_size "
            "or ipc: host, or point SLIDEDP_SHM_DIR at a larger tmpfs"}


class Board:
    """Cross-process progress counters in shared memory (int64), polled by the rank processes.

    x86 stores are seen in program order, and every counter is written after the data it announces, so a
    reader that sees a counter also sees the data.
    """

    # fixed slots (4 and 5: the checkpoint handshake of slidedp.step.rank)
    STOP_REQUEST, STOP_STEP, BOUNDARY, SAVE_REQUEST = 0, 1, 2, 3
    HOST_READY = 6  # 1 once the launcher has filled the state: the ranks start before it is, and wait for it
    # 1 while the launcher pages in fresh AdamW moments (host_fill.MomentPager; set before HOST_READY), back to 0
    # once they are; 2 if that failed. 0 from the start where nothing is paged in.
    MOMENTS_PAGING = 7
    FIXED = 8

    def __init__(self, layout: HostLayout, create: bool):
        self.units = len(layout.unit_numels)
        self.world = layout.world
        self.slots = layout.staging_slots
        n_updated = self.units * self.world
        n_seq = self.world * self.slots
        n_read = self.world * self.world * self.slots
        self._o_updated = self.FIXED
        self._o_seq = self._o_updated + n_updated
        self._o_read = self._o_seq + n_seq
        self._o_norm_seq = self._o_read + n_read
        self._o_pinned = self._o_norm_seq + self.world
        size = self._o_pinned + self.world
        self.ints = _map(layout, "board", size, torch.int64, create)
        # two blocks by step parity: a rank may publish step t+1 before a slower updater has read step t
        self.floats = _map(layout, "norms", 2 * self.world, torch.float64, create)
        if create:
            self.ints.zero_()
            self.floats.zero_()

    # scalar flags
    def get(self, slot: int) -> int:
        return int(self.ints[slot])

    def set(self, slot: int, value: int) -> None:
        self.ints[slot] = value

    # unit u's shard r has been updated through step t
    def updated(self, unit: int, rank: int) -> int:
        return int(self.ints[self._o_updated + unit * self.world + rank])

    def set_updated(self, unit: int, rank: int, step: int) -> None:
        self.ints[self._o_updated + unit * self.world + rank] = step

    def min_updated(self, unit: int) -> int:
        base = self._o_updated + unit * self.world
        return int(self.ints[base : base + self.world].min())

    # gradient staging handshake
    def grad_seq(self, owner: int, slot: int) -> int:
        return int(self.ints[self._o_seq + owner * self.slots + slot])

    def set_grad_seq(self, owner: int, slot: int, seq: int) -> None:
        self.ints[self._o_seq + owner * self.slots + slot] = seq

    def read_done(self, reader: int, owner: int, slot: int) -> int:
        return int(self.ints[self._o_read + (reader * self.world + owner) * self.slots + slot])

    def set_read_done(self, reader: int, owner: int, slot: int, seq: int) -> None:
        self.ints[self._o_read + (reader * self.world + owner) * self.slots + slot] = seq

    # each rank's page-locking of the state is done (the launcher pages in fresh moments only after it)
    def set_pinned(self, rank: int) -> None:
        self.ints[self._o_pinned + rank] = 1

    def all_pinned(self) -> bool:
        return bool(self.ints[self._o_pinned : self._o_pinned + self.world].all())

    # global-norm exchange
    def publish_norm(self, rank: int, step: int, sumsq: float) -> None:
        self.floats[(step % 2) * self.world + rank] = sumsq
        self.ints[self._o_norm_seq + rank] = step

    def norm_seq(self, rank: int) -> int:
        return int(self.ints[self._o_norm_seq + rank])

    def norms(self, step: int) -> list[float]:
        base = (step % 2) * self.world
        return [float(x) for x in self.floats[base : base + self.world]]


def wait_until(predicate, what: str, timeout_s: float = 600.0, abort=None) -> float:
    """Spin, then sleep, until predicate() holds; returns the seconds waited. abort() raising stops the wait."""
    t0 = time.perf_counter()
    spins = 0
    while not predicate():
        spins += 1
        if spins > 200:
            time.sleep(0.0002 if spins < 5000 else 0.002)
        if spins % 1000 == 0:
            if abort is not None:
                abort()
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
    return time.perf_counter() - t0


class HostState:
    """Maps the shared host state; `create` in the launching process, `attach` in each rank."""

    def __init__(self, layout: HostLayout, create: bool, keep_state: bool = False):
        self.layout = layout
        n = layout.total
        fresh = create and not keep_state  # keep_state: the master, moments and delivery copy exist already
        self.master = _map(layout, "master", n, torch.float32, fresh)
        self.exp_avg = _map(layout, "exp_avg", n, torch.float32, fresh)
        self.exp_avg_sq = _map(layout, "exp_avg_sq", n, torch.float32, fresh)
        if layout.delivery_dtype == "bfloat16":
            self.delivery = _map(layout, "delivery", n, torch.bfloat16, fresh)
        else:
            self.delivery = self.master  # fp32 precision delivers the master itself: no second copy
        # Gradient staging: `staging_slots` units per rank; with the host route every rank reads its shard of
        # every other rank's slot, so the staging lives in shared memory too.
        self.staging = _map(layout, "staging", layout.world * layout.staging_slots * layout.slot_numel,
                            torch.float32, create)
        # the gradient held for exact clipping, per unit in fp32 or (losslessly) bf16: slidedp.step.layout
        held = layout.held_numels()
        self._held_places = layout.held_places()
        self.held = _map(layout, "held", held["held"], torch.float32, create) if held["held"] else None
        self.held16 = _map(layout, "held16", held["held16"], torch.bfloat16, create) if held["held16"] else None
        self.board = Board(layout, create)
        self._registered: list[tuple[torch.Tensor, list[int]]] = []  # (tensor, the base address of each range)
        self._edges: set[int] = set()  # the addresses where a registered range starts or ends (dma_pieces)
        # Fresh segments are truncated to nothing and extended (_map), so the AdamW moments already read as zeros:
        # writing zeros would touch 8 B/param for nothing. A kept state (keep_state) keeps its moments.
        self.fresh = fresh
        self._shared_bytes: int | None = None  # shared_bytes(), once listed

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, layout: HostLayout, keep_state: bool = False) -> HostState:
        """Create the run's segments; keep_state maps an existing state of the same run name (benchmarks)."""
        os.makedirs(layout.directory, exist_ok=True)
        with open(layout.path("manifest.json"), "w", encoding="utf-8") as fh:
            json.dump({"owner_pid": os.getpid(), "created": time.time(), "layout": asdict(layout)}, fh)
        try:
            return cls(layout, create=True, keep_state=keep_state)
        except BaseException:
            unlink(layout, keep_state=keep_state)
            raise

    @classmethod
    def attach(cls, layout: HostLayout) -> HostState:
        return cls(layout, create=False)

    def pin_staging(self, threads: int = PIN_THREADS, populate: bool = True) -> None:
        """Page-lock the gradient staging (once per rank process). The launcher never writes it, so a rank does
        this before the state is filled. Fresh staging is a hole: registering it whole would allocate and zero
        its pages one by one on one thread (Qwen3-8B with the embedding and head updated on the host: 8 slots of
        2.5 GB, 12-16 s of the rank's start on the GPU machine). It is registered instead in ranges of whole
        slots, each first populated for writing (`populate`, MADV_POPULATE_WRITE), on the page-lock threads."""
        if torch.cuda.is_available():
            slots = self.layout.world * self.layout.staging_slots
            self._lock(self.staging, [i * self.layout.slot_numel for i in range(slots)],
                       MADV_POPULATE_WRITE if populate else None, threads)

    def pin(self, threads: int = PIN_THREADS, populate: bool = True) -> None:
        """Page-lock the delivery copy (and the staging, if `pin_staging` has not) for async DMA (once per rank
        process).

        The delivery copy is registered as several ranges at once, one thread each (pin_ranges: every range
        whole units, so no copy of a unit spans two registrations); with `threads` 1 it is registered whole.
        Each range's pages are first mapped in bulk (`populate`): the launcher wrote them, so this process has
        them in no page table yet, and registering would fault them in one by one while holding this process's
        memory-map lock, which the rank's loading thread needs for its imports. populate False leaves that to
        the registering (scripts/probe_rank_start.py compares the two)."""
        if torch.cuda.is_available():
            self.pin_staging(threads, populate)
            self._lock(self.delivery, self.layout.offsets, MADV_POPULATE_READ if populate else None, threads,
                       whole_on_one_thread=True)

    def _lock(self, t: torch.Tensor, starts: list[int], advice: int | None, threads: int,
              whole_on_one_thread: bool = False) -> None:
        """Register `t` once, on `threads` threads, in ranges starting at element offsets `starts` (pin_ranges),
        each populated first with `advice` (None: not); whole_on_one_thread: one range when `threads` is 1."""
        if any(t is r for r, _ in self._registered):
            return
        size, nbytes = t.element_size(), t.numel() * t.element_size()
        if whole_on_one_thread and threads == 1:
            ranges = [(0, nbytes)]
        else:
            ranges = pin_ranges([o * size for o in starts], nbytes)
        self._registered.append((t, _register(t.data_ptr(), ranges, max(1, threads), advice)))
        self._edges.update(t.data_ptr() + b for r in ranges for b in r)

    def pin_units(self, units: list[int], kinds: tuple[str, ...], threads: int = PIN_THREADS) -> None:
        """Page-lock the given units' part of each kind ("master", "exp_avg", "exp_avg_sq") for async DMA, once
        per rank process: the units updated by streaming through the GPUs (slidedp.step.streamed_update) read and
        write them there. The master, where it is the delivery copy itself, is left to `pin`, which locks it
        whole. The part spans whole pages, so it never shares a page with another registration."""
        if not units or not torch.cuda.is_available():
            return
        page = os.sysconf("SC_PAGE_SIZE")
        offsets = self.layout.offsets
        first, last = min(units), max(units)
        for kind in kinds:
            t = getattr(self, kind)
            if t is self.delivery or any(t is r for r, _ in self._registered):
                continue
            size = t.element_size()
            start = offsets[first] * size // page * page
            end = min(-(-(offsets[last] + self.layout.unit_numels[last]) * size // page) * page,
                      -(-t.numel() * size // page) * page)
            starts = [o * size - start for o in offsets[first : last + 1]]
            ranges = [(start + a, start + b) for a, b in pin_ranges([max(0, o) for o in starts], end - start)]
            self._registered.append((t, _register(t.data_ptr(), ranges, max(1, threads), MADV_POPULATE_WRITE)))
            self._edges.update(t.data_ptr() + b for r in ranges for b in r)

    def unpin(self) -> None:
        """Unregister every range pin registered (nothing without CUDA)."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for _, ptrs in self._registered:
                for ptr in ptrs:
                    cudart.cudaHostUnregister(ptr)
            self._registered.clear()
            self._edges.clear()

    def dma_pieces(self, view: torch.Tensor) -> list[tuple[int, int]]:
        """Element ranges [a, b) that cover a contiguous view of this state, each wholly inside one page-locked
        range or wholly outside every one: a CUDA copy must not straddle a registration's edge (it fails with
        cudaErrorInvalidValue). pin_units registers a streamed unit's part from the page it starts on, which may
        hold the end of a unit the GPUs update (slidedp.step.device_update copies that unit in pieces)."""
        return split_at(view.data_ptr(), view.numel(), view.element_size(), self._edges)

    # ------------------------------------------------------------------ views
    def _unit(self, flat: torch.Tensor, u: int) -> torch.Tensor:
        off = self.layout.offsets[u]
        return flat[off : off + self.layout.unit_numels[u]]

    def master_unit(self, u: int) -> torch.Tensor:
        return self._unit(self.master, u)

    def exp_avg_unit(self, u: int) -> torch.Tensor:
        return self._unit(self.exp_avg, u)

    def exp_avg_sq_unit(self, u: int) -> torch.Tensor:
        return self._unit(self.exp_avg_sq, u)

    def delivery_unit(self, u: int) -> torch.Tensor:
        return self._unit(self.delivery, u)

    def held_unit(self, u: int) -> torch.Tensor:
        """Unit u's held gradient (fp32, or bf16 where the layout holds it so): only with clipping, host units."""
        kind, off = self._held_places[u]
        flat = self.held if kind == "held" else self.held16
        return flat[off : off + self.layout.unit_numels[u]]

    def staging_slot(self, rank: int, slot: int) -> torch.Tensor:
        m = self.layout.slot_numel
        base = (rank * self.layout.staging_slots + slot) * m
        return self.staging[base : base + m]

    def state_bytes(self) -> int:
        """Bytes of the authoritative state (master, moments, delivery copy): ~14 B/param in bf16."""
        n = self.layout.total
        return n * 12 + (n * 2 if self.layout.delivery_dtype == "bfloat16" else 0)

    def shared_bytes(self) -> int:
        """Every shared segment of this run, staging and board included. Their files do not change while they are
        mapped, so they are listed once (the launcher asks for every step's record)."""
        if self._shared_bytes is None:
            self._shared_bytes = sum(os.path.getsize(p) for kind in ("master", "exp_avg", "exp_avg_sq", "delivery",
                                                                     "staging", "held", "held16", "board",
                                                                     "norms")
                                     for p in _segment_files(self.layout, kind))
        return self._shared_bytes


STATE_KINDS = ("master", "exp_avg", "exp_avg_sq", "delivery")


def unlink(layout: HostLayout, keep_state: bool = False) -> None:
    """Remove the run's segments; keep_state leaves the state itself (and its manifest) for a later run."""
    kinds = ("staging", "held", "held16", "board", "norms") + (() if keep_state else STATE_KINDS + ("manifest.json",))
    for kind in kinds:
        for path in _segment_files(layout, kind) if kind != "manifest.json" else [layout.path(kind)]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _segment_files(layout: HostLayout, kind: str) -> list[str]:
    """The files of a segment that exist: path(kind), or its stripes path(kind).0, .1, ..."""
    import glob

    path = layout.path(kind)
    stripes = [p for p in glob.glob(glob.escape(path) + ".*") if p[len(path) + 1:].isdigit()]
    return ([path] if os.path.exists(path) else []) + sorted(stripes, key=lambda p: int(p[len(path) + 1:]))
