"""Streams and events with one interface on CUDA and on the CPU.

On CUDA the engine runs compute on the default stream and copies on one stream per direction, ordered by events
(never by device-wide synchronisation). On the CPU (gloo, development and CI) the same code runs with streams and
events that do nothing, because every operation is already complete when it returns.
"""

from __future__ import annotations

import contextlib
import time

import torch


class _NullEvent:
    """On the CPU every op has finished when it returns, so an event is just the host clock at record time."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _NullStream:
    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Streams:
    """compute (the current stream), h2d and d2h copy streams of one rank."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.h2d = torch.cuda.Stream(device)
            self.d2h = torch.cuda.Stream(device)
        else:
            self.compute = self.h2d = self.d2h = _NullStream()

    def event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing) if self.cuda else _NullEvent()

    def on(self, stream):
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def record(self, stream, timing: bool = False):
        ev = self.event(timing)
        if self.cuda:
            ev.record(stream)
        return ev


def allocator_fraction(cap_bytes: int, card_bytes: int, context_bytes: int) -> float:
    """The share of a card's memory PyTorch's allocator may hold under a gpu_memory_gib cap of cap_bytes: the cap
    less what the CUDA context and NCCL take outside the allocator (context_bytes), never more than the card."""
    if cap_bytes <= context_bytes:
        raise ValueError(f"a GPU memory cap of {cap_bytes / 2**30:g} GiB leaves nothing once the CUDA context "
                         f"({context_bytes / 2**30:g} GiB) is counted")
    return min(1.0, (cap_bytes - context_bytes) / card_bytes)


def apply_memory_cap(device: torch.device, cap_bytes: int | None) -> dict | None:
    """Limit this process's allocator on `device` so that the job's use of the card, context included, stays
    within cap_bytes (the job's gpu_memory_gib); returns what was set, for the rank's first record.

    The context is counted at slidedp.config.GPU_CONTEXT_BYTES, the allowance the planner leaves for it, rather
    than read off the card: the card may be shared, and cudaMemGetInfo counts every process on it. The record
    carries what the card reported in use when the cap was set (`in_use_at_start_bytes`), so the real context of a
    dedicated card can be compared with the allowance. An allocation past the limit raises CUDA out-of-memory as a
    smaller card would."""
    if cap_bytes is None or device.type != "cuda":
        return None
    from slidedp.config import GPU_CONTEXT_BYTES

    free, total = torch.cuda.mem_get_info(device)
    fraction = allocator_fraction(cap_bytes, total, GPU_CONTEXT_BYTES)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"cap_bytes": int(cap_bytes), "card_bytes": int(total), "allocator_limit_bytes": int(fraction * total),
            "in_use_at_start_bytes": int(total - free)}
