"""The working window: a fixed pool of GPU unit buffers fed ahead of the compute stream.

A step's units are used in a known order (the schedule: embedding, layers 1..L, head, layers L..1 per
micro-batch). The window walks that schedule `slots - 1` items ahead of the compute stream and issues each
delivery on the h2d stream as soon as a buffer is free, so the next unit arrives while the current one computes.
Order is kept with events only: a delivery waits for the event recorded after the last compute that read the
buffer, and compute waits for the delivery's ready event. Eviction is decided from the schedule (the buffer whose
unit is needed again furthest in the future goes first), never from timing, so every rank makes the same
deliveries (and all-gathers); timing only decides how early each is issued. The embedding, the head and any resident layers have buffers of their own and are
delivered once per step: a resident layer's weights stay between forward and backward, saving a transfer. Kept
units (updated on the device: the embedding and head under `policy.edge_update: gpu`, the leading
`policy.device_layers` layers) are never delivered: the device updates their buffers in place on the compute
stream (slidedp.step.device_update).

Before the first delivery of a unit in step t the window waits until the host update of step t-1 has finished
for that unit: for every shard with replicated delivery, for its own shard with sharded delivery. That wait is
the exposed update time (`update_tail`). A streamed layer whose updated weights the device holds
(`device_weights`: slidedp.step.streamed_update) is copied from there instead, the device ordering the copy
after that update: no wait of the issuing thread, nothing over the link.
"""

from __future__ import annotations

import time

import torch
from slidedp.schedule import window_plan
from slidedp.step import trace
from slidedp.step.host_state import HostState, wait_until
from slidedp.step.routes import Routes


class Window:
    def __init__(self, *, padded: list[int], dedicated: set[int], slots: int, dtype: torch.dtype,
                 device: torch.device, routes: Routes, state: HostState, rank: int, abort=None,
                 kept: frozenset[int] = frozenset()):
        self.padded = padded
        self.routes = routes
        self.streams = routes.streams
        self.state = state
        self.rank = rank
        self.abort = abort
        self.dedicated_units = set(dedicated)
        self.kept = set(kept)
        assert self.kept <= self.dedicated_units
        layer_sizes = [padded[u] for u in range(len(padded)) if u not in self.dedicated_units]
        slot_numel = max(layer_sizes) if layer_sizes else 0
        self.num_slots = slots if slot_numel else 0
        self.slot_bufs = [torch.empty(slot_numel, dtype=dtype, device=device) for _ in range(self.num_slots)]
        self.dedicated = {u: torch.empty(padded[u], dtype=dtype, device=device) for u in sorted(self.dedicated_units)}
        self.update_wait_s = 0.0
        # (shard, event) of a unit whose updated weights the device holds for this step, else None (set by the
        # engine when layers are streamed: slidedp.step.streamed_update.StreamedUpdate.weights_for)
        self.device_weights = None
        self._free_ev: dict[object, object] = {}
        self._slot_ready: dict[int, object] = {}
        self.schedule: list[int] = []

    # ------------------------------------------------------------------ per step
    def begin_step(self, step: int, schedule: list[int]) -> None:
        self.step = step
        self.schedule = schedule
        self.assign: list[object] = [None] * len(schedule)
        self.ready: list[object] = [None] * len(schedule)
        self.issued = -1
        self.released = -1
        self.plan, _ = window_plan(schedule, self.dedicated_units, self.num_slots)
        self._dedicated_ready: dict[int, object] = {}
        self._delivered: set[int] = set()  # units delivered at least once this step (their update is done)
        self._kept_ready = self.streams.record(self.streams.compute)  # kept buffers are written on compute

    def _update_ready(self, u: int) -> bool:
        """Step t-1's host update of unit u has finished on every shard this rank's delivery reads."""
        need, board = self.step - 1, self.state.board
        if self.routes.delivery == "sharded":
            return board.updated(u, self.rank) >= need
        return board.min_updated(u) >= need

    def _ready_to_deliver(self, u: int) -> bool:
        """Unit u can be delivered without the issuing thread waiting: its weights are on the device (the device
        orders the copy after their update), or its host update has finished."""
        return self._on_device(u) is not None or self._update_ready(u)

    def _wait_for_update(self, u: int) -> None:
        t0 = time.perf_counter()
        wait_until(lambda: self._update_ready(u), f"the host update of unit {u} for step {self.step}",
                   abort=self.abort)
        t1 = time.perf_counter()
        self.update_wait_s += t1 - t0
        if trace.TRACE is not None and t1 - t0 > 1e-4:
            trace.TRACE.add("wait_update", self.step, unit=u, t0=t0, t1=t1)

    def _deliver(self, u: int, buf: torch.Tensor, key: object) -> object:
        ready = self.streams.event()
        free = self._free_ev.get(key, self.streams.event())
        on_device = self._on_device(u)
        if on_device is not None:  # last step's update left it on the device: no wait for the host, no link
            self.routes.deliver_from_device(u, *on_device, buf, free, ready)
            return ready
        if u not in self._delivered:  # the first delivery of a step waits for last step's update
            self._wait_for_update(u)
            self._delivered.add(u)
        self.routes.deliver(u, self.state.delivery_unit(u), buf, free, ready)
        return ready

    def _on_device(self, u: int):
        return self.device_weights(u, self.step) if self.device_weights is not None else None

    def _issue(self, k: int, block: bool) -> bool:
        """Start item k as the step's plan says; False while its buffer is still in use, or when (not block) its
        unit's host update is still running: prefetching ahead never holds back the current unit's compute.

        The plan (which buffer, whether a transfer is needed) comes from the schedule alone, so every rank makes
        the same deliveries and all-gathers whatever the timing; timing only moves when each is issued."""
        u = self.schedule[k]
        entry = self.plan[k]
        if entry[0] == "d":
            if u in self.kept:
                self.assign[k], self.ready[k] = ("d", u), self._kept_ready
                return True
            if entry[1]:
                if not block and not self._ready_to_deliver(u):
                    return False
                self._dedicated_ready[u] = self._deliver(u, self.dedicated[u], ("d", u))
            self.assign[k] = ("d", u)
            self.ready[k] = self._dedicated_ready[u]
            return True
        _, slot, deliver, prev_item, _src = entry
        if deliver:
            if prev_item > self.released or (not block and not self._ready_to_deliver(u)):
                return False
            self._slot_ready[slot] = self._deliver(u, self.slot_bufs[slot], ("s", slot))
        self.assign[k] = ("s", slot)
        self.ready[k] = self._slot_ready[slot]
        return True

    def get(self, k: int) -> torch.Tensor:
        """The buffer holding schedule item k's unit, with the compute stream ordered after its delivery."""
        horizon = min(len(self.schedule) - 1, k + max(1, self.num_slots - 1))
        while self.issued < horizon:
            if not self._issue(self.issued + 1, block=self.issued + 1 <= k):
                break
            self.issued += 1
        if self.issued < k:
            raise RuntimeError(f"window of {self.num_slots} buffers cannot hold schedule item {k}")
        self.streams.compute.wait_event(self.ready[k])
        return self.buffer(k)

    def buffer(self, k: int) -> torch.Tensor:
        kind, idx = self.assign[k]
        return self.dedicated[idx] if kind == "d" else self.slot_bufs[idx]

    def release(self, k: int) -> None:
        """The compute stream has been given every op that reads item k's buffer."""
        ev = self.streams.record(self.streams.compute)
        self._free_ev[self.assign[k]] = ev
        self.released = k

    def hbm_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.slot_bufs) + sum(
            b.numel() * b.element_size() for b in self.dedicated.values())
