"""Units updated on the ranks' devices: the embedding and head (`policy.edge_update: gpu`) and the leading
`policy.device_layers` decoder layers.

The host update is bound by host memory traffic (28-34 bytes per parameter per step); the embedding and the
lm_head are the largest units of a decoder model (Qwen3-8B: 1.24B of 8.19B parameters in two units), and where
HBM is spare, whole decoder layers can follow them. For each such unit every rank keeps its 1/N shard of the fp32
master weights and AdamW moments in device memory (16 B per parameter / N, the reduced gradient included),
reduces the unit's gradient with a reduce-scatter on the d2h stream, applies AdamW there after the backward and
all-gathers the rounded weights into the unit's own buffer: these units are never delivered from the host and
their gradients never leave the GPU. A device-updated layer is therefore always resident.

The numerics are the host update's: the same fused AdamW on the same fp32 shard, the same learning rate, the
gradient norm accumulated in the same order (each unit's sum of squares where the host route would send it) and
the clip factor computed in float64 as the host computes it. On the CPU (gloo) both paths run the same kernels and
train to the same bits (tests/runtime/test_device_update.py).

A decoder layer's gradient waits for the update in bf16 where that is exact (one rank, bf16 layers, no
accumulation: slidedp.step.layout.held_in_bf16; the engine widened a bf16 tensor to fp32 for the trip, so rounding
it back changes no value): 14 B per parameter of device state instead of 16, which leaves room for more layers on
the GPU. The update widens it into one fp32 scratch chunk at a time (`layout.chunk_elements`, as the streamed
update does) and applies the same AdamW to each chunk: elementwise, on chunks whose bounds are whole multiples of
any vector width, so the same bits as over the whole unit.

The host state keeps its slots for these units: `write_back()` copies the shards (master, both moments and the
bf16 copy when the host keeps one) into it before every checkpoint and at the end of the run, so checkpoints,
resume and export read one authoritative host state as always; `load()` reads them from it at start (resume).
"""

from __future__ import annotations

import torch
from slidedp.config import OptimizerConfig, ScheduleConfig
from slidedp.step.collectives import all_gather
from slidedp.step.host_state import HostState
from slidedp.step.layout import chunk_elements
from slidedp.step.optimizer import clip_coefficient, clips, lr_at
from slidedp.step.routes import Routes, ShardMap, sum_of_squares


class DeviceUpdate:
    def __init__(self, *, units: list[int], state: HostState, shards: ShardMap, routes: Routes,
                 buffers: dict[int, torch.Tensor], opt: OptimizerConfig, sched: ScheduleConfig, total_steps: int,
                 device: torch.device, hold_bf16: tuple[int, ...] = ()):
        self.units = list(units)
        self.state, self.shards, self.routes, self.buffers = state, shards, routes, buffers
        self.opt, self.sched, self.total_steps = opt, sched, total_steps
        self.device = device
        self._step_t = torch.zeros((), dtype=torch.float32, device=device)
        self.world, self.rank = shards.world, shards.rank
        self.streams = routes.streams
        z = {u: shards.shard_len(u) for u in self.units}
        # padding past the unit's end stays zero: zero gradient, zero weight, zero moments (weight decay keeps 0)
        self.master = {u: torch.zeros(z[u], dtype=torch.float32, device=device) for u in self.units}
        self.exp_avg = {u: torch.zeros(z[u], dtype=torch.float32, device=device) for u in self.units}
        self.exp_avg_sq = {u: torch.zeros(z[u], dtype=torch.float32, device=device) for u in self.units}
        # the reduced gradient's shard; with one rank a layer's gradient is copied out of the engine's parity
        # buffers (reused two units later), while the embedding's and head's accumulators stay until the update
        # (bf16 for the units in `hold_bf16`, with one rank: see the module's docstring; widened a chunk at a time
        # into `_wide` for the update)
        edges = {0, len(shards.numels) - 1}
        bf16 = set(hold_bf16) if self.world == 1 else set()
        self.grad = {u: torch.zeros(z[u], dtype=torch.bfloat16 if u in bf16 else torch.float32, device=device)
                     for u in self.units if self.world > 1 or u not in edges}
        narrow = [z[u] for u, g in self.grad.items() if g.dtype != torch.float32]
        self._wide = torch.empty(chunk_elements(narrow), dtype=torch.float32, device=device) if narrow else None
        self._reduced: dict[int, torch.Tensor] = {}
        self._reduced_ev: dict[int, object] = {}
        self._global_sumsq: torch.Tensor | None = None

    # ------------------------------------------------------------------ host state <-> device
    def load(self, moments: bool = True) -> None:
        """Read this rank's shards from the host state and fill the units' buffers (start and resume). moments
        False: the host's AdamW moments are known to be zero (a run from step 0), as the device's already are: only
        the master is read (the moments of a fresh state are pages the launcher is still faulting in, 8 of the
        12 B/param)."""
        for u in self.units:
            lo, hi = self.shards.own_range(u)
            parts = [(self.master[u], self.state.master_unit(u))]
            if moments:
                parts += [(self.exp_avg[u], self.state.exp_avg_unit(u)),
                          (self.exp_avg_sq[u], self.state.exp_avg_sq_unit(u))]
            for dev, host in parts:
                self._copy(dev[: hi - lo], host[lo:hi], host[lo:hi])
            self._fill(u)

    def write_back(self) -> None:
        """Copy this rank's shards into the host state (before a checkpoint, at the end); returns when done."""
        for u in self.units:
            lo, hi = self.shards.own_range(u)
            if hi <= lo:
                continue
            for host, dev in ((self.state.master_unit(u), self.master[u]), (self.state.exp_avg_unit(u), self.exp_avg[u]),
                              (self.state.exp_avg_sq_unit(u), self.exp_avg_sq[u])):
                self._copy(host[lo:hi], dev[: hi - lo], host[lo:hi])
            if self.state.delivery is not self.state.master:
                self.state.delivery_unit(u)[lo:hi].copy_(self.state.master_unit(u)[lo:hi])

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, host: torch.Tensor) -> None:
        """dst := src between the GPU and the host state, in pieces that never straddle the edge of a page-locked
        range (`host` is the host side; HostState.dma_pieces)."""
        for a, b in self.state.dma_pieces(host):
            dst[a:b].copy_(src[a:b])

    def _fill(self, u: int) -> None:
        """The unit's buffer := the rounded master, from every rank's shard (compute stream)."""
        buf, sl = self.buffers[u], self.shards.shard_len(u)
        r0 = self.rank * sl
        buf[r0 : r0 + sl].copy_(self.master[u])
        if self.world > 1:
            all_gather(buf[: self.shards.padded[u]], buf[r0 : r0 + sl],
                                        group=self.routes.delivery_group)
            self.routes.bytes.collective += (self.shards.padded[u] - sl) * buf.element_size()

    # ------------------------------------------------------------------ one step
    def reduce(self, u: int, grad: torch.Tensor) -> None:
        """Unit u's gradient (grad[:padded], fp32, complete on the compute stream) reduced to this rank's shard,
        its sum of squares added to the step's norm; on the d2h stream, where the other units' sums are added."""
        s = self.streams
        lo, hi = self.shards.own_range(u)
        with s.on(s.d2h):
            s.d2h.wait_stream(s.compute)
            if self.world > 1:
                self.routes.reduce_scatter_unit(u, self.grad[u], grad)
                shard = self.grad[u]
                if hi > lo:
                    self.routes.sumsq += sum_of_squares(shard[: hi - lo])
            else:
                if hi > lo:  # the fp32 values, whichever dtype the shard keeps them in
                    self.routes.sumsq += sum_of_squares(grad[: hi - lo])
                shard = grad[: self.shards.padded[u]]
                if u in self.grad:
                    self.grad[u].copy_(shard)  # a bf16 shard rounds values that are bf16 already: exact
                    shard = self.grad[u]
            self._reduced_ev[u] = s.record(s.d2h)
        self._reduced[u] = shard

    def reduced_event(self, u: int):
        """After it, the device no longer reads the gradient buffer given to reduce(u)."""
        return self._reduced_ev[u]

    def keep_norm(self) -> None:
        """Called by the routes as the step's sum of squares is complete (d2h stream), before it is reset."""
        self._global_sumsq = self.routes.sumsq.clone()

    def update(self, step: int) -> None:
        """AdamW on both shards (clip factor from the step's global norm, on the device), then refill the
        buffers: all on the compute stream, so the next step's first unit reads the new weights."""
        s = self.streams
        lr = lr_at(step, self.total_steps, self.opt, self.sched)
        coef = found_inf = None
        if not clips(self.opt):
            for u in self.units:  # the reduced shards only, not the other units' copies queued behind them
                s.compute.wait_event(self._reduced_ev.pop(u))
        else:
            s.compute.wait_stream(s.d2h)  # the global norm: every unit's gradient of the step
            coef, skip = clip_coefficient(self._global_sumsq.sqrt(), self.opt.max_grad_norm)
            coef = coef.to(torch.float32)
            # a non-finite norm skips the step's update, as the host updater does, without a device sync: the
            # fused kernel leaves weights and moments untouched when found_inf is 1
            found_inf = skip.to(torch.float32).reshape(())
        # the step count in a device tensor of this update's own, filled on the stream that reads it: a tensor made
        # from a Python number would be copied from pageable memory, which waits for the stream to drain
        step_t = self._step_t
        step_t.fill_(float(step))
        for u in self.units:
            g = self._reduced.pop(u)
            if g.dtype == torch.float32:
                self._adamw(u, slice(None), g, coef, step_t, lr, found_inf)
            else:
                n, c = g.numel(), self._wide.numel()
                for a in range(0, n, c):
                    wide = self._wide[: min(c, n - a)]
                    wide.copy_(g[a : a + c])
                    self._adamw(u, slice(a, a + c), wide, coef, step_t, lr, found_inf)
            self._fill(u)

    def _adamw(self, u: int, part: slice, g: torch.Tensor, coef, step_t: torch.Tensor, lr: float, found_inf) -> None:
        """AdamW on elements `part` of unit u's shard with its fp32 gradient `g` (scaled here by the clip factor)."""
        if coef is not None:
            g.mul_(coef)
        torch._fused_adamw_([self.master[u][part]], [g], [self.exp_avg[u][part]], [self.exp_avg_sq[u][part]], [],
                            [step_t], lr=lr, beta1=self.opt.betas[0], beta2=self.opt.betas[1],
                            weight_decay=self.opt.weight_decay, eps=self.opt.eps, amsgrad=False, maximize=False,
                            found_inf=found_inf)
