"""Layers whose update after the gradient norm streams through the GPUs (`policy.streamed_layers`).

With exact clipping no update can start before the whole gradient's norm is known, so after the backward the host
CPU updates every unit while the GPUs and their PCIe links wait for it (docs/planning.md, "The post-norm update").
For the `streamed_layers` decoder layers right after the device layers the GPUs take that work (the next forward
needs them before the host's, which are the last ones and so have the longest to finish): each unit's reduced
gradient (this rank's shard) waits in GPU memory instead of host memory — in bf16 where that is exact (one rank,
bf16 layers, no accumulation: slidedp.step.layout.held_in_bf16), else in fp32 — and once the norm is known the rank
streams its shard's fp32 master and AdamW moments in from the host state, chunk by chunk, applies the same fused
AdamW with the same clip factor there, and streams them back (12 B/param each way, plus the bf16 copy where the host
keeps one), while the host CPU updates the other units. The host state stays the one authoritative copy: between
steps these units keep on the GPU only their waiting gradient's buffer (which holds their new weights until the next
backward writes the next gradient there, below), and checkpoints, resume and export read the host state as always. A
unit counts as updated (slidedp.step.host_state.Board) once its copies back have landed, which the rank's updater
thread marks; where the weights do not stay on the GPU the window then delivers it like any host-updated unit.

The numbers are the host update's: the gradient norm summed where the host route would sum it, the clip factor in
float64 as the host computes it, and the same AdamW kernel on CPU ranks (tests/runtime/test_streamed_update.py
trains the same bits as the host update there); a non-finite norm skips the step (found_inf), as the host does.

Copies run on two streams of their own, so the next forward's deliveries (the h2d stream) do not queue behind
them: chunks come in on one while the previous chunk's results go out on the other, two sets of chunk buffers
alternating.

The updated weights also stay on the GPU for the next forward (`weights`, with one rank or sharded delivery):
each chunk's new master, rounded to the compute dtype as any delivery rounds it, is written over the part of the
waiting gradient's buffer that chunk has already read, so it takes no memory of its own. The window then fills a
streamed layer's buffer from there (this rank's shard, all-gathered with sharded delivery) as soon as the update
has run on the GPU, instead of waiting for the results to reach the host and bringing them back over the link:
4 B/param (the fp32 master, cast on the GPU) or 2 B/param (the bf16 copy) less on the host-to-GPU direction the
streamed chunks need, at the time the link binds. The host state is written back as before and stays the copy
every later reader (checkpoints, a resumed run, the first step) uses.
"""

from __future__ import annotations

import torch
from slidedp.config import OptimizerConfig, ScheduleConfig
from slidedp.step.host_state import HostState
from slidedp.step.layout import chunk_elements
from slidedp.step.optimizer import clip_coefficient, clips, lr_at
from slidedp.step.routes import Routes, ShardMap, sum_of_squares


class StreamedUpdate:
    def __init__(self, *, units: list[int], state: HostState, shards: ShardMap, routes: Routes,
                 opt: OptimizerConfig, sched: ScheduleConfig, total_steps: int, device: torch.device,
                 hold_bf16: bool, weights_dtype: torch.dtype | None = None):
        self.units = sorted(units)
        self.state, self.shards, self.routes = state, shards, routes
        self.opt, self.sched, self.total_steps = opt, sched, total_steps
        self.device = device
        self._step_t = torch.zeros((), dtype=torch.float32, device=device)
        self.world, self.rank = shards.world, shards.rank
        self.streams = routes.streams
        s = self.streams
        if s.cuda:
            self.s_in, self.s_out = torch.cuda.Stream(device), torch.cuda.Stream(device)
        else:
            self.s_in = self.s_out = s.compute
        hold = torch.bfloat16 if hold_bf16 else torch.float32
        self.grad = {u: torch.zeros(shards.shard_len(u), dtype=hold, device=device) for u in self.units}
        # the updated shard in the compute dtype, over the gradient's buffer (no wider than the held gradient, so
        # chunk [a, b) of it lies over gradient elements below b, which the update has read by then); None: the
        # window delivers these layers from the host (several ranks with replicated delivery)
        self.weights: dict[int, torch.Tensor] | None = None
        if weights_dtype is not None:
            assert torch.empty((), dtype=weights_dtype).element_size() <= torch.empty((), dtype=hold).element_size()
            self.weights = {u: g.view(weights_dtype)[: g.numel()] for u, g in self.grad.items()}
        self._weights_of: dict[int, int] = {}  # the step whose update `weights[u]` holds
        self._weights_ready: dict[int, object] = {}  # recorded on the update's stream after the unit's last chunk
        self.chunk = chunk_elements([shards.shard_len(u) for u in self.units])
        self.deliver_bf16 = state.delivery is not state.master  # the host keeps a bf16 copy to write
        kinds = ("master", "exp_avg", "exp_avg_sq", "grad") + (("delivery",) if self.deliver_bf16 else ())
        self.bufs = [{k: torch.empty(self.chunk, dtype=torch.bfloat16 if k == "delivery" else torch.float32,
                                     device=device) for k in kinds} for _ in range(2)]
        self._free = [s.event(), s.event()]  # buffer set i may be overwritten once its copies back have landed
        self._reduced_ev: dict[int, object] = {}
        self._global_sumsq: torch.Tensor | None = None
        if s.cuda:
            state.pin_units(self.units, ("master", "exp_avg", "exp_avg_sq"))

    def hbm_bytes(self) -> int:
        """GPU memory held for the run: the waiting gradients and the two chunk buffer sets."""
        held = sum(g.numel() * g.element_size() for g in self.grad.values())
        return held + sum(b.numel() * b.element_size() for bufs in self.bufs for b in bufs.values())

    # ------------------------------------------------------------------ during the backward
    def reduce(self, u: int, grad: torch.Tensor) -> None:
        """Unit u's gradient (grad[:padded], fp32, complete on the compute stream) kept on the device: this
        rank's shard of the sum over ranks, its sum of squares added to the step's norm (d2h stream, as every
        other unit's)."""
        s = self.streams
        lo, hi = self.shards.own_range(u)
        with s.on(s.d2h):
            s.d2h.wait_stream(s.compute)
            if self.world > 1:  # an fp32 sum, held in fp32 (held_in_bf16 is for one rank only)
                self.routes.reduce_scatter_unit(u, self.grad[u], grad)
                if hi > lo:
                    self.routes.sumsq += sum_of_squares(self.grad[u][: hi - lo])
            else:
                n = self.shards.numels[u]
                self.routes.sumsq += sum_of_squares(grad[:n])  # the fp32 values, as return_gradient sums them
                self.grad[u][:n].copy_(grad[:n])  # a bf16 hold rounds values that are bf16 already: exact
            self._reduced_ev[u] = s.record(s.d2h)

    def reduced_event(self, u: int):
        """After it, the device no longer reads the gradient buffer given to reduce(u)."""
        return self._reduced_ev[u]

    def weights_for(self, u: int, step: int) -> tuple[torch.Tensor, object] | None:
        """(this rank's shard of unit u as step `step` reads it, event after which it is written) when the GPU
        holds it, else None (the unit is delivered from the host state)."""
        if self.weights is None or u not in self.weights or self._weights_of.get(u) != step - 1:
            return None
        return self.weights[u], self._weights_ready[u]

    def keep_norm(self) -> None:
        """Called by the routes as the step's sum of squares is complete (d2h stream), before it is reset."""
        self._global_sumsq = self.routes.sumsq.clone()

    # ------------------------------------------------------------------ after the backward
    def update(self, step: int) -> dict[int, object]:
        """Queue every unit's update (forward order) behind the step's norm; returns per unit the event after
        which its master, moments and bf16 copy are back in the host state."""
        s = self.streams
        lr = lr_at(step, self.total_steps, self.opt, self.sched)
        coef = found_inf = None
        with s.on(self.s_in):
            self.s_in.wait_stream(s.d2h)  # every gradient of the step reduced, the norm kept
            if clips(self.opt):
                coef, skip = clip_coefficient(self._global_sumsq.sqrt(), self.opt.max_grad_norm)
                coef = coef.to(torch.float32)
                found_inf = skip.to(torch.float32).reshape(())  # the fused kernel then leaves the state alone
            # the step count in a device tensor of this update's own, filled on the stream that reads it: a tensor made
            # from a Python number would be copied from pageable memory, which waits for the stream to drain
            step_t = self._step_t
            step_t.fill_(float(step))
        done: dict[int, object] = {}
        i = 0
        for u in self.units:
            lo, hi = self.shards.own_range(u)
            for a in range(0, hi - lo, self.chunk):
                b = min(hi - lo, a + self.chunk)
                self._chunk(u, lo, a, b, self.bufs[i], i, coef, found_inf, step_t, lr)
                i ^= 1
            done[u] = s.record(self.s_out)
            if self.weights is not None:
                self._weights_ready[u], self._weights_of[u] = s.record(self.s_in), step
        return done

    def _chunk(self, u: int, shard_lo: int, a: int, b: int, buf: dict[str, torch.Tensor], i: int,
               coef, found_inf, step_t, lr: float) -> None:
        """Elements [a, b) of this rank's shard of unit u (which starts at shard_lo in the unit): in, AdamW, the
        new weights kept (`weights`), out, on buffer set i."""
        s, m, st = self.streams, b - a, self.state
        lo, hi, grad = shard_lo + a, shard_lo + b, self.grad[u][a:b]
        host = {"master": st.master_unit(u), "exp_avg": st.exp_avg_unit(u), "exp_avg_sq": st.exp_avg_sq_unit(u)}
        with s.on(self.s_in):
            self.s_in.wait_event(self._free[i])
            for k, t in host.items():
                buf[k][:m].copy_(t[lo:hi], non_blocking=True)
            g = buf["grad"][:m]
            g.copy_(grad)  # widened to fp32 where held in bf16: exact
            if coef is not None:
                g.mul_(coef)
            torch._fused_adamw_([buf["master"][:m]], [g], [buf["exp_avg"][:m]], [buf["exp_avg_sq"][:m]], [],
                                [step_t], lr=lr, beta1=self.opt.betas[0], beta2=self.opt.betas[1],
                                weight_decay=self.opt.weight_decay, eps=self.opt.eps, amsgrad=False,
                                maximize=False, found_inf=found_inf)
            if self.deliver_bf16:
                buf["delivery"][:m].copy_(buf["master"][:m])
            if self.weights is not None:  # over gradient elements this and earlier chunks have read (above)
                self.weights[u][a:b].copy_(buf["master"][:m])
            ready = s.record(self.s_in)
        with s.on(self.s_out):
            self.s_out.wait_event(ready)
            for k, t in host.items():
                t[lo:hi].copy_(buf[k][:m], non_blocking=True)
            if self.deliver_bf16:
                st.delivery_unit(u)[lo:hi].copy_(buf["delivery"][:m], non_blocking=True)
            self._free[i] = s.record(self.s_out)
        nbytes = m * (12 + (2 if self.deliver_bf16 else 0))
        self.routes.bytes.h2d += m * 12
        self.routes.bytes.d2h += nbytes
