"""Delivery and gradient routes between the host state and the GPUs, with per-rank byte counters.

Parameters (host -> GPU):
  replicated  every rank copies the whole unit over its own PCIe link (host traffic grows with the rank count);
  sharded     each rank copies its 1/N and the ranks all-gather over NVLink (host traffic stays 1x).
Gradients (GPU -> host):
  gpu         reduce-scatter between GPUs, each rank returns only its 1/N (already summed);
  host        each rank returns the whole unit and the host sums the ranks' copies (no GPU collective).
Units are padded to a multiple of the world size so every shard has the same length; rank r owns elements
[r*s, min((r+1)*s, n)) of every unit and updates exactly those on the host. Delivery collectives and gradient
collectives use two process groups, so an all-gather of the next unit never queues behind the reduce-scatter
of the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from slidedp.step.cast_ring import CastRing
from slidedp.step.collectives import all_gather, reduce_scatter
from slidedp.step.devices import Streams


def sum_of_squares(x: torch.Tensor, row: int = 4096) -> torch.Tensor:
    """sum(x^2) as a float64 scalar on x's device without a float64 copy of x.

    On CUDA one fused reduction (the upcast happens in registers). On the CPU a float64 reduction runs ~10x slower
    than an AdamW step, and one fp32 dot over millions of elements drifts (2e-5 relative at 32M elements, enough to
    move a reported grad norm past 1e-5), so rows of 4096 are dotted in fp32 by one batched matmul and the row
    sums added in float64: 1e-8 relative, and faster than the blocked dot.
    """
    if x.is_cuda:
        return torch.linalg.vector_norm(x, dtype=torch.float64).square()
    x = x.reshape(-1)
    k = x.numel() // row
    total = torch.zeros((), dtype=torch.float64)
    if k:
        rows = x[: k * row].view(k, 1, row)
        total += torch.bmm(rows, rows.transpose(1, 2)).sum(dtype=torch.float64)
    tail = x[k * row :]
    if tail.numel():
        total += torch.dot(tail, tail).double()
    return total


@dataclass
class ByteCounters:
    h2d: int = 0
    d2h: int = 0
    collective: int = 0  # bytes this rank receives through GPU collectives

    def take(self) -> dict[str, int]:
        out = {"h2d": self.h2d, "d2h": self.d2h, "collective": self.collective}
        self.h2d = self.d2h = self.collective = 0
        return out


@dataclass
class ShardMap:
    numels: list[int]
    world: int
    rank: int
    padded: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.padded = [-(-n // self.world) * self.world for n in self.numels]

    def shard_len(self, u: int) -> int:
        return self.padded[u] // self.world

    def own_range(self, u: int, rank: int | None = None) -> tuple[int, int]:
        r = self.rank if rank is None else rank
        s = self.shard_len(u)
        lo = min(r * s, self.numels[u])
        return lo, min(lo + s, self.numels[u])


class Routes:
    """Issues the copies and collectives of one rank; every call is asynchronous on CUDA."""

    def __init__(self, delivery: str, grad_reduce: str, shards: ShardMap, streams: Streams,
                 delivery_group, grad_group, chunk_bytes: int, cast_scratch_bytes: int = 0):
        self.delivery = delivery  # as resolved for this world (ExecutionPolicy.for_world: one rank, no collectives)
        self.grad_reduce = grad_reduce
        self.shards = shards
        self.streams = streams
        self.delivery_group = delivery_group
        self.grad_group = grad_group
        self.chunk_bytes = chunk_bytes
        self.bytes = ByteCounters()
        self._cast_scratch: torch.Tensor | None = None
        # policy.cast_scratch_mb: the delivery cast through a ring of scratch buffers (slidedp.step.cast_ring)
        self._cast_ring = CastRing(streams.device, cast_scratch_bytes, chunk_bytes) \
            if cast_scratch_bytes and streams.cuda else None
        # gpu route: the global sum of squares of the reduced gradient, accumulated where the shards are
        self.sumsq = torch.zeros((), dtype=torch.float64, device=streams.device)

    def _copy_chunked(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        step = max(1, self.chunk_bytes // max(1, src.element_size()))
        cast = dst.is_cuda and dst.dtype != src.dtype
        if cast and self._cast_ring is not None:
            self._cast_ring.cast(dst, src)
            return
        # fp32 master into a bf16 GPU buffer (delivery_cast: gpu) through the default scratch: each chunk lands in
        # one fp32 scratch buffer and is cast there, on the same stream, so the host never converts and the next
        # chunk's copy waits for the cast that reads the scratch.
        if cast and (self._cast_scratch is None or self._cast_scratch.numel() < step):
            self._cast_scratch = torch.empty(step, dtype=src.dtype, device=dst.device)
        for a in range(0, src.numel(), step):
            part = src[a : a + step]
            if cast:
                tmp = self._cast_scratch[: part.numel()]
                tmp.copy_(part, non_blocking=True)
                dst[a : a + step].copy_(tmp)
            else:
                dst[a : a + step].copy_(part, non_blocking=True)

    # ------------------------------------------------------------------ parameters
    def deliver(self, u: int, host_unit: torch.Tensor, buf: torch.Tensor, buf_free, ready_event) -> None:
        """Fill buf[:padded] with unit u's delivery copy on the h2d stream; ready_event marks completion.

        buf_free: event after which the compute stream no longer reads buf.
        """
        s = self.streams
        n, esize = self.shards.numels[u], host_unit.element_size()
        with s.on(s.h2d):
            s.h2d.wait_event(buf_free)
            if self.delivery == "replicated":
                self._copy_chunked(buf[:n], host_unit)
                self.bytes.h2d += n * esize
            else:
                lo, hi = self.shards.own_range(u)
                if hi > lo:
                    self._copy_chunked(buf[lo:hi], host_unit[lo:hi])
                self.bytes.h2d += (hi - lo) * esize
                self._gather_shards(u, buf)
            if s.cuda:
                ready_event.record(s.h2d)

    def deliver_from_device(self, u: int, shard: torch.Tensor, shard_ready, buf: torch.Tensor, buf_free,
                            ready_event) -> None:
        """Fill buf[:padded] with unit u from this rank's shard of it already on the device (a streamed layer's
        updated weights, slidedp.step.streamed_update), written once shard_ready is passed: a device copy, and the
        all-gather of sharded delivery. Only for one rank or sharded delivery (replicated delivery reads whole
        units from the host, and gathers nothing)."""
        s = self.streams
        lo, hi = self.shards.own_range(u)
        with s.on(s.h2d):
            s.h2d.wait_event(buf_free)
            s.h2d.wait_event(shard_ready)
            if hi > lo:
                buf[lo:hi].copy_(shard[: hi - lo])
            if self.shards.world > 1:
                if self.delivery != "sharded":
                    raise ValueError("a unit's shard on the device is delivered by all-gather: sharded delivery")
                self._gather_shards(u, buf)
            if s.cuda:
                ready_event.record(s.h2d)

    def _gather_shards(self, u: int, buf: torch.Tensor) -> None:
        """Every rank's shard of unit u into buf[:padded], from this rank's in place (sharded delivery, on the
        current stream: on CUDA the stream waits for the all-gather, the host does not)."""
        sl = self.shards.shard_len(u)
        r0 = self.shards.rank * sl
        work = all_gather(buf[: self.shards.padded[u]], buf[r0 : r0 + sl], group=self.delivery_group, async_op=True)
        work.wait()
        self.bytes.collective += (self.shards.padded[u] - sl) * buf.element_size()

    def finish_norm(self, pinned_out: torch.Tensor, keep=None):
        """All-reduce the step's sum of squares (gpu route / one rank) and start its copy to the host.

        keep(): called on the d2h stream with the global value in place (the device-side update's clip reads it).
        Returns the event after which pinned_out holds the global value; resets the accumulator."""
        s = self.streams
        with s.on(s.d2h):
            if self.grad_reduce == "gpu":
                dist.all_reduce(self.sumsq, group=self.grad_group)
            if keep is not None:
                keep()
            pinned_out.copy_(self.sumsq, non_blocking=True)
            self.sumsq.zero_()
            done = s.event()
            if s.cuda:
                done.record(s.d2h)
        return done

    # ------------------------------------------------------------------ gradients
    @property
    def reduces_on_gpus(self) -> bool:
        """Gradients are reduce-scattered on the GPUs: the gpu route with several ranks (one rank has nothing to
        reduce, and copies its gradient out as the host route does)."""
        return self.grad_reduce == "gpu" and self.shards.world > 1

    def reduce_scatter_unit(self, u: int, shard: torch.Tensor, grad: torch.Tensor, async_op: bool = False):
        """Unit u's gradient (grad[:padded]) summed over the ranks of the gradient group, this rank's part into
        shard[:shard_len]; counts the bytes the other ranks' parts bring. The work handle with async_op."""
        sl = self.shards.shard_len(u)
        work = reduce_scatter(shard[:sl], grad[: self.shards.padded[u]], op=dist.ReduceOp.SUM, group=self.grad_group,
                              async_op=async_op)
        self.bytes.collective += (self.shards.padded[u] - sl) * grad.element_size()
        return work

    def return_gradient(self, u: int, grad: torch.Tensor, shard_buf: torch.Tensor, staging: torch.Tensor,
                        done_event) -> None:
        """Send unit u's gradient (grad[:padded], reduce dtype, ready on the compute stream) to the host.

        gpu route with several ranks: reduce-scatter into shard_buf, then copy this rank's shard to staging[:shard].
        host route, or one rank: copy the whole unit to staging[:n]; the host sums the ranks.
        done_event marks that grad, shard_buf and staging are no longer touched by the device.
        """
        s = self.streams
        n, esize = self.shards.numels[u], grad.element_size()
        if self.reduces_on_gpus:
            work = self.reduce_scatter_unit(u, shard_buf, grad, async_op=True)
            lo, hi = self.shards.own_range(u)
            with s.on(s.d2h):
                work.wait()
                if hi > lo:
                    self._copy_chunked(staging[: hi - lo], shard_buf[: hi - lo])
                    self.sumsq += sum_of_squares(shard_buf[: hi - lo])
                self.bytes.d2h += (hi - lo) * esize
                if s.cuda:
                    done_event.record(s.d2h)
        else:
            with s.on(s.d2h):
                s.d2h.wait_stream(s.compute)
                self._copy_chunked(staging[:n], grad[:n])
                if self.shards.world == 1:
                    self.sumsq += sum_of_squares(grad[:n])
                self.bytes.d2h += n * esize
                if s.cuda:
                    done_event.record(s.d2h)
