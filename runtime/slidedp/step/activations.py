"""Elastic activation placement per decoder layer: checkpoint, keep, or offload.

checkpoint  the forward runs without a graph and saves only the unit's input; backward recomputes the unit.
keep        the forward keeps its autograd graph on the GPU: no recompute, more HBM.
offload     like keep, but the saved activations go to host memory during forward (d2h stream) and come back
            on the h2d stream while the layer above runs its backward (no recompute and no HBM, paid in PCIe
            traffic, counted in the rank's h2d / d2h bytes). They come back into one of two device slots that the
            engine reuses layer after layer, each rewritten only after the backward that last read it: the HBM
            of offload is two layers' activations, however far the issuing thread runs ahead. On the CPU the
            same copies run synchronously (the bookkeeping is what the CPU tests check).

A kept graph would pin the window buffer its weights came from. Saved-tensor hooks therefore store weights by
reference (unit, offset, shape, stride) instead of by value, and hand back a view of whichever window buffer holds
the unit when its backward runs: the buffer is free for other units in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ACTIVATION_POLICIES = ("checkpoint", "keep", "offload")


class SavedActivations:
    """Saved-tensor hooks for one kept or offloaded layer of one micro-batch."""

    def __init__(self, unit: int, weight_buf: torch.Tensor, lookup: Callable[[int], torch.Tensor],
                 offload: bool, streams=None, counters=None):
        self.unit = unit
        self.lookup = lookup
        self.offload = offload
        self.streams = streams
        self.counters = counters  # ByteCounters of the rank: offloaded bytes are PCIe traffic like any copy
        self._storage = weight_buf.untyped_storage().data_ptr()
        self._device = weight_buf.device
        self.host: list[torch.Tensor] = []  # one host copy (bytes) per saved storage
        self._fetched: list[torch.Tensor] | None = None  # their device copies, once fetched
        self._fresh = False  # fetched into memory of its own (no slot): freed after the compute stream's use
        self._sent = self._ready = None
        # Autograd saves one storage under several views and for several ops (a layer's normed input feeds q, k
        # and v, once as it is and once flattened): each storage is copied once, as the calibration counts saved
        # bytes. The tensors are held until end_forward, so that no new tensor can take a storage's memory meanwhile.
        self._seen: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}  # (storage, version) -> (copy, a view)

    def pack(self, t: torch.Tensor) -> Any:
        if t.device == self._device and t.untyped_storage().data_ptr() == self._storage:
            return ("weight", t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if self.offload and t.numel() >= 4096:
            st = t.untyped_storage()
            key = (st.data_ptr(), t._version)  # written in place since an earlier save: copied again
            if key not in self._seen:
                s = self.streams
                whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
                host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=s.cuda)
                s.d2h.wait_stream(s.compute)
                with s.on(s.d2h):
                    host.copy_(whole, non_blocking=s.cuda)
                    if s.cuda:
                        whole.record_stream(s.d2h)
                self.host.append(host)
                self._sent = s.record(s.d2h)  # the fetch waits for this layer's copies, not the whole d2h queue
                if self.counters is not None:
                    self.counters.d2h += st.nbytes()
                self._seen[key] = (len(self.host) - 1, t)
            return ("host", self._seen[key][0], t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        return t

    def end_forward(self) -> None:
        """The layer's forward is over: its GPU tensors may go (each freed once its copy out has run)."""
        self._seen.clear()

    def nbytes(self) -> int:
        """Device bytes its fetch needs (each host copy at an aligned offset)."""
        return sum(_aligned(h.numel()) for h in self.host)

    def prefetch(self, slot: torch.Tensor | None = None, after=None) -> None:
        """Bring the host copies back on the h2d stream: into `slot` (device bytes, at least nbytes(), rewritten
        only after the event `after`, its last reader), or into memory of their own without a slot. The engine
        calls it one layer ahead of this layer's backward; unpack does at the latest."""
        if not self.host or self._fetched is not None:
            return
        s = self.streams
        fetched, off = [], 0
        with s.on(s.h2d):
            s.h2d.wait_event(self._sent)
            if after is not None:
                s.h2d.wait_event(after)
            for h in self.host:
                n = h.numel()
                dst = slot[off : off + n] if slot is not None else torch.empty(n, dtype=torch.uint8,
                                                                               device=self._device)
                dst.copy_(h, non_blocking=s.cuda)
                fetched.append(dst)
                off += _aligned(n)
        self._ready = s.record(s.h2d)
        self._fetched, self._fresh = fetched, slot is None
        if self.counters is not None:
            self.counters.h2d += sum(h.numel() for h in self.host)

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        if packed[0] == "weight":
            _, offset, shape, stride = packed
            return self.lookup(self.unit).as_strided(shape, stride, offset)
        self.prefetch()
        self.streams.compute.wait_event(self._ready)
        _, index, dtype, offset, shape, stride = packed
        dev = self._fetched[index]
        if self._fresh and self.streams.cuda:
            dev.record_stream(self.streams.compute)  # allocated on the h2d stream, read on compute
        base = dev.storage_offset() // torch.empty((), dtype=dtype).element_size()  # slot offsets are aligned
        return torch.empty(0, dtype=dtype, device=dev.device).set_(dev.untyped_storage(), base + offset, shape, stride)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _aligned(n: int, to: int = 512) -> int:
    return (n + to - 1) // to * to
