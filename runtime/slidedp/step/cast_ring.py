"""The delivery cast through a ring of fp32 scratch buffers (`policy.cast_scratch_mb`, delivery_cast: gpu).

With the default scratch (one transfer chunk, slidedp.step.routes) each chunk of fp32 master is copied into one
buffer and cast from it on the copy stream: a chunk's copy waits for the cast before it, and that cast, a kernel,
waits for the compute kernel running. A long GEMM of the layer computing meanwhile holds the link with it (the
Qwen3-8B forward's deliveries at micro-batch 8 ran at 33-39 GB/s against a link of 55; docs/planning.md,
"Prediction against measured steps").

Here the scratch is n buffers of half a chunk (ring_geometry): piece i of a unit lands in buffer i % n on the copy
stream and is cast from there on a stream of its own at a higher priority than compute, so a copy waits only for
the cast that last read its buffer, and the link goes on while the buffers ahead of a waiting cast last (7 of the 8
of 256 MiB at 64 MiB chunks: 4.3 ms of a 55 GB/s link, longer than that GEMM). The copy stream waits for the last cast before it goes on, so what it does next (an all-gather,
the unit's ready event) sees the whole unit. The same cast of the same values: the bits are those of the default.
"""

from __future__ import annotations

import torch

# CUDA priority of the cast stream (lower is higher; torch maps it into the device's range): above compute's, so a
# cast's blocks are scheduled ahead of the compute stream's waiting blocks
CAST_PRIORITY = -1


def ring_geometry(scratch_bytes: int, chunk_bytes: int, element_size: int) -> tuple[int, int]:
    """(buffers, elements per buffer) of a scratch of scratch_bytes: half-chunk buffers, at least two (two halves
    of the scratch where it is smaller than a chunk), their bytes within scratch_bytes."""
    if scratch_bytes < 2 * element_size or chunk_bytes < element_size:
        raise ValueError(f"a cast scratch of {scratch_bytes} B cannot hold two buffers of {element_size}-byte "
                         "elements")
    n = max(2, 2 * scratch_bytes // max(1, chunk_bytes))
    return n, scratch_bytes // n // element_size


class CastRing:
    """One rank's delivery cast through `scratch_bytes` of fp32 scratch; cast() is called on the copy stream."""

    def __init__(self, device: torch.device, scratch_bytes: int, chunk_bytes: int):
        self.device = device
        self.scratch_bytes = scratch_bytes
        self.chunk_bytes = chunk_bytes
        self.stream = torch.cuda.Stream(device, priority=CAST_PRIORITY)
        self.buffers: list[torch.Tensor] = []
        self.read: list = []  # the cast stream's event after its last read of each buffer

    def cast(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst (on this GPU, the compute dtype) <- src (host fp32, page-locked), asynchronously."""
        copy_stream = torch.cuda.current_stream(self.device)
        if not self.buffers:
            n, step = ring_geometry(self.scratch_bytes, self.chunk_bytes, src.element_size())
            self.buffers = [torch.empty(step, dtype=src.dtype, device=self.device) for _ in range(n)]
            self.read = [None] * n
        n, step = len(self.buffers), self.buffers[0].numel()
        for i, a in enumerate(range(0, src.numel(), step)):
            part = src[a : a + step]
            tmp = self.buffers[i % n][: part.numel()]
            if self.read[i % n] is not None:
                copy_stream.wait_event(self.read[i % n])
            tmp.copy_(part, non_blocking=True)
            self.stream.wait_stream(copy_stream)
            with torch.cuda.stream(self.stream):
                dst[a : a + step].copy_(tmp)
            ev = torch.cuda.Event()
            ev.record(self.stream)
            self.read[i % n] = ev
        copy_stream.wait_stream(self.stream)
