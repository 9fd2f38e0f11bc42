"""The training step of one rank: stream units through the window, return gradients, let the host update.

Per micro-batch: embedding, decoder layers 1..L (each by its activation policy), then the loss head runs forward
and backward together in token chunks (full fp32 logits never exist), then layers L..1 backward, then the
embedding's backward. Each unit's gradient leaves the GPU as soon as it exists (on the last micro-batch; earlier
ones accumulate on the GPU in fp32) and the rank's updater thread applies AdamW to this rank's shard on the host.
Under `policy.edge_update: gpu` the embedding and head stay on the device instead, and so do the leading
`policy.device_layers` layers: reduced there, updated there after the backward (slidedp.step.device_update),
never delivered from the host. The `policy.streamed_layers` layers after those keep their gradients on the device
too and are updated after the norm by streaming their host state through it (slidedp.step.streamed_update).

Held-out evaluation (`eval_loss`) streams the units through the same window on a forward-only schedule
(slidedp.schedule.eval_schedule) under torch.no_grad(): it reads the weights of the step it follows, sends no
gradient and never touches the updater, the device-side update or their state.

Semantics are exactly synchronous data-parallel AdamW: the loss is the sum of token cross-entropies divided by
the number of non-ignored targets of the whole global batch (all ranks, all micro-batches), gradients are summed
over ranks, and step t+1 reads weights only after step t's update of that unit has finished on every shard it
reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from slidedp.config import JobConfig
from slidedp.policy import ExecutionPolicy
from slidedp.schedule import eval_schedule, step_schedule
from slidedp.step import trace
from slidedp.step.activations import SavedActivations
from slidedp.step.collectives import all_gather
from slidedp.step.compiled import layer_function
from slidedp.step.device_update import DeviceUpdate
from slidedp.step.devices import Streams
from slidedp.step.host_state import HostState
from slidedp.step.layout import held_in_bf16, streamed_weights_stay
from slidedp.step.model_adapter import ModelAdapter
from slidedp.step.optimizer import GradItem, Updater
from slidedp.step.routes import Routes, ShardMap
from slidedp.step.streamed_update import StreamedUpdate
from slidedp.step.window import Window


@dataclass
class StepTiming:
    step: int
    t_start: float
    data_s: float
    update_tail_s: float
    staging_wait_s: float
    tokens: int
    events: dict[str, Any] = field(default_factory=dict)
    loss_sum: Any = None
    target_tokens: Any = None
    stats: Any = None  # device tensor gathered from every rank: bytes and peak HBM
    cpu_start: tuple[float, float] = (0.0, 0.0)  # CPU seconds so far: the issuing thread's, the whole process's
    norm: Any = None  # (event, host sum of squares of the gradient) where the norm is reduced on the devices


# Figures per rank gathered after each step (_step_figures): bytes h2d, d2h, collective, allocator peak, card
# memory in use, allocator retries.
STEP_FIGURES = 6


class RankEngine:
    def __init__(self, cfg: JobConfig, adapter: ModelAdapter, state: HostState, policy: ExecutionPolicy, rank: int,
                 world: int, device: torch.device, groups: tuple, abort=None, zero_moments: bool = False):
        policy = policy.for_world(world)  # the one world-of-one rule, whoever built the policy
        self.cfg, self.adapter, self.state, self.policy = cfg, adapter, state, policy
        self.rank, self.world, self.device = rank, world, device
        self.abort = abort
        self.dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
        self.streams = Streams(device)
        # two device slots that offloaded activations come back into, and the compute-stream event after the
        # backward that last read each (slidedp.step.activations)
        self._act_slots: list[torch.Tensor | None] = [None, None]
        self._act_free: list = [None, None]
        numels = [u.numel for u in adapter.units]
        self.shards = ShardMap(numels, world, rank)
        self.routes = Routes(policy.delivery, policy.grad_reduce, self.shards, self.streams,
                             groups[0], groups[1], policy.chunk_mb << 20, policy.cast_scratch_mb << 20)
        self.L = adapter.num_layers
        self.head_unit = self.L + 1
        self.activations: list[str] = list(policy.activations)
        device_units = policy.device_units(self.L)
        # device-updated layers are resident in every ExecutionPolicy (the window checks: kept units are dedicated)
        resident = {i + 1 for i, r in enumerate(policy.resident) if r}
        self.window = Window(padded=self.shards.padded, dedicated={0, self.head_unit, *resident},
                             slots=policy.window, dtype=self.dtype, device=device,
                             routes=self.routes, state=state, rank=rank, abort=abort, kept=device_units)
        self.updater = Updater(state=state, shards=self.shards, grad_reduce=self.routes.grad_reduce,
                               opt=cfg.optimizer, sched=cfg.schedule, total_steps=cfg.steps,
                               num_units=len(numels), threads=torch.get_num_threads(),
                               device_units=device_units | policy.streamed_units(), abort=abort,
                               post_norm_passes=policy.post_norm_passes)
        self.device_update: DeviceUpdate | None = None
        if device_units:
            if self.world > 1 and self.routes.grad_reduce != "gpu":
                raise ValueError("units updated on the GPUs reduce their gradients there: it needs grad_reduce gpu")
            self.device_update = DeviceUpdate(units=sorted(device_units), state=state, shards=self.shards,
                                              routes=self.routes, buffers=self.window.dedicated, opt=cfg.optimizer,
                                              sched=cfg.schedule, total_steps=cfg.steps, device=device,
                                              hold_bf16=held_in_bf16(world, cfg.precision, cfg.grad_accum, self.L))
            self.device_update.load(moments=not zero_moments)
        self.streamed: StreamedUpdate | None = None
        if policy.streamed_units():
            if self.world > 1 and self.routes.grad_reduce != "gpu":
                raise ValueError("streamed layers reduce their gradients on the GPUs: it needs grad_reduce gpu")
            self.streamed = StreamedUpdate(
                units=sorted(policy.streamed_units()), state=state, shards=self.shards, routes=self.routes,
                opt=cfg.optimizer, sched=cfg.schedule, total_steps=cfg.steps, device=device,
                hold_bf16=bool(held_in_bf16(world, cfg.precision, cfg.grad_accum, self.L)),
                weights_dtype=self.dtype if streamed_weights_stay(world, policy.delivery) else None)
            self.window.device_weights = self.streamed.weights_for
        self.rotary = adapter.rotary(device)
        # the decoder layers' forward: eager, or through torch.compile with policy.compiled_layers on a device that
        # has a backend (slidedp.step.compiled)
        self.layer_fn = layer_function(adapter, policy.compiled_layers, device)
        max_layer = max(self.shards.padded[1 : self.head_unit], default=0)
        # Layer gradients land in a flat buffer per parity (bf16 in bf16 precision), then go out in fp32 (g32;
        # the embedding and head leave from their own fp32 accumulators, so g32 is sized for a layer). The
        # reduce-scatter's output (shard32) exists only where there is a reduce-scatter: several ranks reducing on
        # the GPUs. Sized as slidedp.planning.memory_model.gradient_bytes counts them.
        self.gbuf = [torch.empty(max_layer, dtype=self.dtype, device=device) for _ in range(2)]
        g32_len = max_layer if self.dtype != torch.float32 else 0
        self.g32 = [torch.empty(g32_len, dtype=torch.float32, device=device) for _ in range(2)]
        shard_len = max(self.shards.shard_len(u) for u in range(len(numels))) if self.routes.reduces_on_gpus else 0
        self.shard32 = [torch.empty(shard_len, dtype=torch.float32, device=device) for _ in range(2)]
        self._gdone = [self.streams.event(), self.streams.event()]
        self._parity = 0
        # The embedding and head accumulate in fp32 across loss chunks, tied contributions and micro-batches.
        self.gE = torch.zeros(self.shards.padded[0], dtype=torch.float32, device=device)
        self.gH = torch.zeros(self.shards.padded[self.head_unit], dtype=torch.float32, device=device)
        self.acc = None
        if cfg.grad_accum > 1:
            self.acc = {u: torch.zeros(self.shards.padded[u], dtype=torch.float32, device=device)
                        for u in range(1, self.head_unit)}
        self.seq = 0
        self._alloc_retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if self.streams.cuda else 0
        # pinned scalars for the device-reduced norm, alternating by step (the updater may read step t late)
        self._norm_host = [torch.zeros((), dtype=torch.float64, pin_memory=self.streams.cuda) for _ in range(2)]
        self.loss_chunk = policy.loss_chunk_tokens
        self.staging_wait_s = 0.0

    # ------------------------------------------------------------------ schedule
    def schedule(self, micro_batches: int) -> list[int]:
        return step_schedule(self.L, micro_batches)

    # ------------------------------------------------------------------ gradient exit
    def _next_parity(self) -> int:
        self._parity ^= 1
        # buffers of this parity are reused only after their last transfer has completed
        self.streams.compute.wait_event(self._gdone[self._parity])
        return self._parity

    def _send(self, u: int, src32: torch.Tensor, parity: int, step: int) -> None:
        self.seq += 1
        waited = self.updater.wait_slot_free(self.seq, abort=self._abort_check)
        self.staging_wait_s += waited
        if trace.TRACE is not None and waited > 0:
            t1 = trace.now()
            trace.TRACE.add("wait_slot", step, unit=u, t0=t1 - waited, t1=t1)
        slot = self.seq % self.state.layout.staging_slots
        done = self.streams.event()
        self.routes.return_gradient(u, src32, self.shard32[parity], self.state.staging_slot(self.rank, slot), done)
        if not self.streams.cuda:
            done = self.streams.event()
        self._gdone[parity] = done
        self.updater.submit(GradItem(self.seq, step, u, slot, done))

    def _abort_check(self) -> None:
        self.updater.check()
        if self.abort is not None:
            self.abort()

    def _layer_gradient_out(self, u: int, gflat: torch.Tensor, parity: int, last: bool, step: int) -> None:
        n = self.shards.padded[u]
        if self.acc is not None:
            self.acc[u].add_(gflat[:n])
            if not last:
                return
            src = self.acc[u]
        elif gflat.dtype == torch.float32:
            src = gflat
        else:
            src = self.g32[parity][:n]
            src.copy_(gflat[:n])
        reduced = self._reduced_on_device(u, src)
        if reduced is not None:
            self._gdone[parity] = reduced  # the parity is reused after the reduction
            return
        self._send(u, src, parity, step)

    def _reduced_on_device(self, u: int, grad: torch.Tensor):
        """Unit u is updated on the device, or streamed through it: its gradient is reduced there instead of
        leaving for the host. Returns the event after which `grad` is free again, None for a host-updated unit."""
        for dev in (self.device_update, self.streamed):
            if dev is not None and u in dev.units:
                dev.reduce(u, grad)
                return dev.reduced_event(u)
        return None

    # ------------------------------------------------------------------ units
    def _leaves(self, u: int, buf: torch.Tensor, grad_flat: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return self.adapter.param_leaves(self.adapter.units[u], buf, grad_flat)

    def _layer_forward(self, u: int, buf: torch.Tensor, h: torch.Tensor, ctx: dict) -> tuple:
        policy = self.activations[u - 1]
        if policy == "checkpoint":
            with torch.no_grad():
                params = self.adapter.param_views(self.adapter.units[u], buf)
                out = self.layer_fn(params, h, ctx)
            return out, ("checkpoint", h)
        saved = SavedActivations(u, buf, self._lookup, offload=(policy == "offload"), streams=self.streams,
                                 counters=self.routes.bytes)
        h_in = h.detach().requires_grad_(True)
        leaves = self._leaves(u, buf, None)
        with torch.enable_grad(), saved.hooks():
            out = self.layer_fn(leaves, h_in, ctx)
        saved.end_forward()
        return out.detach(), ("graph", out, h_in, leaves, saved)

    def _prefetch_activations(self, saved: dict[int, tuple], u: int) -> None:
        """Fetch layer u's offloaded activations into slot u % 2; its last reader was the backward two layers up
        (or an earlier micro-batch's), whose end the copy waits for on the GPU."""
        entry = saved.get(u)
        if entry is None or entry[0] != "graph" or not entry[4].offload:
            return
        acts, i = entry[4], u % 2
        need = acts.nbytes()
        if self._act_slots[i] is None or self._act_slots[i].numel() < need:
            if self._act_free[i] is not None:
                self._act_free[i].synchronize()  # the old slot's last reader, before it goes (first use, or larger)
            self._act_slots[i] = None
            self._act_slots[i] = torch.empty(need, dtype=torch.uint8, device=self.device)
        acts.prefetch(self._act_slots[i], self._act_free[i])

    def _activations_read(self, saved: tuple, u: int) -> None:
        """After layer u's backward is queued: its slot may be rewritten once the compute stream gets there."""
        if saved[0] == "graph" and saved[4].offload and saved[4].host:
            self._act_free[u % 2] = self.streams.record(self.streams.compute)

    def _lookup(self, u: int) -> torch.Tensor:
        return self.window.buffer(self._current_item)

    def _layer_backward(self, u: int, buf: torch.Tensor, saved: tuple, grad_out: torch.Tensor, ctx: dict,
                        gflat: torch.Tensor) -> torch.Tensor:
        gflat.zero_()
        if saved[0] == "checkpoint":
            h_in = saved[1].detach().requires_grad_(True)
            leaves = self._leaves(u, buf, gflat)
            with torch.enable_grad():
                out = self.layer_fn(leaves, h_in, ctx)
            torch.autograd.backward(out, grad_out)
        else:
            _, out, h_in, leaves, acts = saved
            for p in self.adapter.units[u].params:
                leaves[p.name].grad = gflat[p.offset : p.offset + p.numel].view(p.shape)
            torch.autograd.backward(out, grad_out)
        return h_in.grad

    def _head(self, h: torch.Tensor, targets: torch.Tensor, chunk_valid: list[bool], n_targets: torch.Tensor,
              hbuf: torch.Tensor, ebuf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final norm + lm_head + cross-entropy, forward and backward, chunk by chunk."""
        H, V = self.adapter.hidden, self.adapter.vocab
        norm_w = hbuf[:H].detach().requires_grad_(True)
        if self.adapter.tied:
            w = ebuf[: V * H].view(V, H).detach().requires_grad_(True)
        else:
            w = hbuf[H : H + V * H].view(V, H).detach().requires_grad_(True)
        flat = h.reshape(-1, H)
        grad_h = torch.zeros_like(flat)
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        C = self.loss_chunk
        for ci, c0 in enumerate(range(0, flat.shape[0], C)):
            if not chunk_valid[ci]:
                continue
            x = flat[c0 : c0 + C].detach().requires_grad_(True)
            with torch.enable_grad():
                logits = F.linear(self.adapter.norm_forward(norm_w, x), w).float()
                loss = F.cross_entropy(logits, targets[c0 : c0 + C], ignore_index=-100, reduction="sum")
                (loss / n_targets).backward()
            grad_h[c0 : c0 + C] = x.grad
            loss_sum += loss.detach()
            # fp32 accumulation across chunks (bf16 weight gradients would lose low bits chunk after chunk)
            self.gH[:H].add_(norm_w.grad)
            norm_w.grad = None
            if self.adapter.tied:
                self.gE[: V * H].add_(w.grad.reshape(-1))
            else:
                self.gH[H : H + V * H].add_(w.grad.reshape(-1))
            w.grad = None
        return grad_h.view_as(h), loss_sum

    def _head_loss(self, h: torch.Tensor, targets: torch.Tensor, chunk_valid: list[bool], hbuf: torch.Tensor,
                   ebuf: torch.Tensor) -> torch.Tensor:
        """The summed token cross-entropy of _head's forward, chunk by chunk, without its backward (no_grad)."""
        H, V = self.adapter.hidden, self.adapter.vocab
        norm_w = hbuf[:H]
        w = ebuf[: V * H].view(V, H) if self.adapter.tied else hbuf[H : H + V * H].view(V, H)
        flat = h.reshape(-1, H)
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        C = self.loss_chunk
        for ci, c0 in enumerate(range(0, flat.shape[0], C)):
            if chunk_valid[ci]:
                logits = F.linear(self.adapter.norm_forward(norm_w, flat[c0 : c0 + C]), w).float()
                loss_sum += F.cross_entropy(logits, targets[c0 : c0 + C], ignore_index=-100, reduction="sum")
        return loss_sum

    # ------------------------------------------------------------------ evaluation
    def eval_loss(self, after_step: int, micro_batches: list) -> tuple[float, int]:
        """(sum of the token cross-entropies, number of non-ignored targets) of the model as step `after_step`
        left it, over every rank's evaluation micro-batches (each rank passes the same number of them).

        Forward only: embedding, layers 1..L and the loss head per micro-batch, the units streamed through the
        window as in a step (a unit's first delivery waits for step after_step's update of it; units updated on
        the device are read from their kept buffers); no gradient, no updater, no AdamW state or step count."""
        M = len(micro_batches)
        if M == 0:
            return 0.0, 0
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        with torch.no_grad():
            self.window.begin_step(after_step + 1, eval_schedule(self.L, M))
            k = 0
            for m, mb in enumerate(micro_batches):
                ids, targets_dev, chunk_valid, ctx = self._inputs(mb)
                totals[1] += int((mb.labels[:, 1:] != -100).sum())
                if m == 0:
                    ebuf = self.window.get(k)
                    k_embed = k
                    k += 1
                h = self.adapter.embed_forward(ebuf[: self.shards.numels[0]].view(self.adapter.vocab, -1), ids)
                ctx["position_embeddings"] = self.rotary(h, ctx["position_ids"])
                for u in range(1, self.head_unit):
                    buf = self.window.get(k)
                    h = self.layer_fn(self.adapter.param_views(self.adapter.units[u], buf), h, ctx)
                    self.window.release(k)
                    k += 1
                if m == 0:
                    hbuf = self.window.get(k)
                    k_head = k
                    k += 1
                totals[0] += self._head_loss(h, targets_dev, chunk_valid, hbuf, ebuf).double()
                del h
            self.window.release(k_head)
            self.window.release(k_embed)
        dist.all_reduce(totals, group=self.routes.grad_group)
        loss_sum, n_targets = totals.tolist()
        return loss_sum, int(n_targets)

    # ------------------------------------------------------------------ one step
    def run_step(self, step: int, micro_batches: list, data_s: float) -> StepTiming:
        """One optimizer step: every micro-batch's forward and backward through the window (the window's own
        order, slidedp.schedule), gradients handed to the host or updated on the devices as they come, then the
        step's end (the norm, the device update) and its figures."""
        t_start = time.perf_counter()
        cpu_start = (time.thread_time(), time.process_time())
        if trace.TRACE is not None:
            trace.TRACE.add("step", step, t=t_start)
        s = self.streams
        ev = {"start": s.record(s.compute, timing=True)}
        tr = trace.TRACE if trace.TRACE is not None and trace.TRACE.wanted(step) else None  # per-layer events
        M = len(micro_batches)
        n_targets = self._begin_step(step, micro_batches)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        k = 0
        tokens = 0
        for m, mb in enumerate(micro_batches):
            last = m == M - 1
            ids, targets_dev, chunk_valid, ctx = self._inputs(mb)
            tokens += ids.numel()
            # forward
            if m == 0:
                ebuf = self.window.get(k)
                k_embed = k
                k += 1
            h = self.adapter.embed_forward(ebuf[: self.shards.numels[0]].view(self.adapter.vocab, -1), ids)
            ctx["position_embeddings"] = self.rotary(h, ctx["position_ids"])
            saved: dict[int, tuple] = {}
            for u in range(1, self.head_unit):
                self._current_item = k
                buf = self.window.get(k)
                ready = s.record(s.compute, timing=True) if tr is not None else None
                h, saved[u] = self._layer_forward(u, buf, h, ctx)
                if tr is not None:
                    tr.layer(step, m, "forward", u, self.activations[u - 1], ready, s.record(s.compute, timing=True))
                self.window.release(k)
                k += 1
            self._prefetch_activations(saved, self.head_unit - 1)  # the first layer back, under the loss head
            if m == 0:
                ev["forward_end"] = s.record(s.compute, timing=True)
                hbuf = self.window.get(k)
                k_head = k
                k += 1
            grad_h, mb_loss = self._head(h, targets_dev, chunk_valid, n_targets, hbuf, ebuf)
            loss_sum += mb_loss
            del h
            if last:
                self.window.release(k_head)
                if self._reduced_on_device(self.head_unit, self.gH) is None:
                    parity = self._next_parity()
                    self._send(self.head_unit, self.gH, parity, step)
            # backward
            for u in range(self.head_unit - 1, 0, -1):
                self._current_item = k
                buf = self.window.get(k)
                parity = self._next_parity()
                gflat = self.gbuf[parity]
                here = saved.pop(u)
                self._prefetch_activations(saved, u - 1)  # its H2D runs while this layer's backward computes
                ready = s.record(s.compute, timing=True) if tr is not None else None
                grad_h = self._layer_backward(u, buf, here, grad_h, ctx, gflat)
                if tr is not None:
                    tr.layer(step, m, "backward", u, self.activations[u - 1], ready, s.record(s.compute, timing=True))
                self._activations_read(here, u)
                self.window.release(k)
                self._layer_gradient_out(u, gflat, parity, last, step)
                k += 1
            self.adapter.embed_backward(self.gE[: self.shards.numels[0]].view(self.adapter.vocab, -1), ids, grad_h)
            del grad_h
            if last:
                self.window.release(k_embed)
                if self._reduced_on_device(0, self.gE) is None:
                    parity = self._next_parity()
                    self._send(0, self.gE, parity, step)
        norm = self._end_backward(step, ev)
        dist.all_reduce(loss_sum, group=self.routes.grad_group)
        gathered = self._step_figures()
        ev["stats"] = s.record(s.compute)
        if trace.TRACE is not None:
            trace.TRACE.gpu(step, ev)
        return StepTiming(step, t_start, data_s, self.window.update_wait_s, self.staging_wait_s, tokens, ev,
                          loss_sum, n_targets, gathered, cpu_start, norm)

    def _begin_step(self, step: int, micro_batches: list) -> torch.Tensor:
        """Counters and the window set for the step, the gradient buffers zeroed once free; returns the global
        batch's count of non-ignored targets, which the loss divides by and which is known before any backward."""
        s = self.streams
        self.window.update_wait_s = 0.0
        self.staging_wait_s = 0.0
        self.routes.bytes.take()
        if s.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.window.begin_step(step, self.schedule(len(micro_batches)))
        local_targets = sum(int((mb.labels[:, 1:] != -100).sum()) for mb in micro_batches)
        n_targets = torch.tensor([float(local_targets)], device=self.device)
        dist.all_reduce(n_targets, group=self.routes.grad_group)
        # gE and gH are reused only after last step's transfers out of them (one d2h stream: the latest
        # event of each parity covers every earlier copy)
        s.compute.wait_event(self._gdone[0])
        s.compute.wait_event(self._gdone[1])
        self.gE.zero_()
        self.gH.zero_()
        if self.acc is not None:
            for a in self.acc.values():
                a.zero_()
        return n_targets[0].clamp_min(1.0)

    def _inputs(self, mb) -> tuple[torch.Tensor, torch.Tensor, list[bool], dict[str, Any]]:
        """A micro-batch on the device: (token ids, next-token targets flat, which loss chunks hold a target,
        the layers' context: position ids and the packed rows' attention mask)."""
        ids = mb.input_ids.to(self.device, non_blocking=True)
        pos = mb.position_ids.to(self.device, non_blocking=True)
        targets = torch.full_like(mb.labels, -100)
        targets[:, :-1] = mb.labels[:, 1:]
        C = self.loss_chunk
        tflat = targets.reshape(-1)
        chunk_valid = [bool((tflat[c0 : c0 + C] != -100).any()) for c0 in range(0, tflat.numel(), C)]
        targets_dev = tflat.to(self.device, non_blocking=True)
        ctx: dict[str, Any] = {"position_ids": pos, "attention_mask": None}
        if mb.segment_ids is not None:
            from slidedp.data.packing import attention_mask_from_segments

            ctx["attention_mask"] = attention_mask_from_segments(mb.segment_ids).to(self.device)
        return ids, targets_dev, chunk_valid, ctx

    def _end_backward(self, step: int, ev: dict) -> tuple | None:
        """The backward is issued: the updater is told (with the global norm's sum of squares where the devices
        reduce it: (event, host scalar), else None, returned), the units updated on the devices are, and then the
        streamed layers' updates (the updater learns when each is back on the host once they are queued).

        The streamed updates come last: queuing their chunks' copies and kernels keeps this thread 20-60 ms (a few
        hundred calls for Qwen3-4B's 17-20 streamed layers; the gap between `backward_issued` and `updates_issued`
        in every clipped step timeline kept), and until then the host updater would not know the step's backward
        was over nor the compute stream have the device updates to run, both idle behind the norm."""
        s = self.streams
        ev["backward_end"] = s.record(s.compute, timing=True)
        if trace.TRACE is not None:
            trace.TRACE.add("backward_issued", step, t=trace.now())
        queue_streamed = self.updater.norm_on_device and self.streamed is not None
        if self.updater.norm_on_device:
            host_norm = self._norm_host[step % 2]
            keeps = [d.keep_norm for d in (self.device_update, self.streamed) if d is not None and self.updater.clip]
            norm = (self.routes.finish_norm(host_norm, (lambda: [k() for k in keeps]) if keeps else None),
                    host_norm)
            self.updater.end_backward(step, norm, streamed_pending=queue_streamed)
        else:
            norm = None
            self.updater.end_backward(step)
        if self.device_update is not None:
            self.device_update.update(step)
            # the device update counts as backward, as the overlap model counts it
            ev["backward_end"] = s.record(s.compute, timing=True)
        if queue_streamed:
            # queued after the norm on streams of their own, ahead of the next forward's deliveries
            self.updater.add_streamed(step, self.streamed.update(step))
        if trace.TRACE is not None:
            trace.TRACE.add("updates_issued", step, t=trace.now())
        return norm

    def _step_figures(self) -> torch.Tensor:
        """Every rank's bytes moved (h2d, d2h, collective), allocator peak, card memory in use and the allocator's
        retries this step (STEP_FIGURES), gathered."""
        b = self.routes.bytes.take()
        peak = used = retries = 0
        if self.streams.cuda:  # the allocator's peak, and what the driver counts in use on the card (context included)
            free, total = torch.cuda.mem_get_info(self.device)
            peak, used = torch.cuda.max_memory_reserved(self.device), total - free
            # each retry freed the allocator's cached blocks and called cudaMalloc again: a device-wide wait that no
            # plan prices, and a sign that the plan's HBM budget is tighter than the allocator can live with
            total_retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
            retries, self._alloc_retries = total_retries - self._alloc_retries, total_retries
        stats = torch.tensor([b["h2d"], b["d2h"], b["collective"], peak, used, retries], dtype=torch.int64,
                             device=self.device)
        gathered = torch.zeros(STEP_FIGURES * self.world, dtype=torch.int64, device=self.device)
        all_gather(gathered, stats, group=self.routes.grad_group)
        return gathered
