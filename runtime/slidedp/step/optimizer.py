"""Layer-wise CPU AdamW, overlapped with backward, on the host state.

Each rank process runs one updater thread that owns that rank's shard of every unit. A unit's update starts as
soon as its reduced gradient is on the host, while the GPU carries on with the rest of the backward. Ordering is
what hides the update: gradients arrive L+1 -> 0, but the next forward needs unit 0 first, so once the backward
of a step has ended the updater finishes what is left in forward order and marks each unit ready at once; the
next forward then overlaps the remaining updates instead of waiting for all of them.

Exact global-norm clipping (optimizer.max_grad_norm > 0) needs the norm of the whole gradient before any update is
final: reduced gradients are held on the host, the ranks exchange their partial sums of squares, and then every
unit is updated in forward order with the clip factor of torch.nn.utils.clip_grad_norm_; a non-finite norm skips
the step's update altogether. Without clipping the norm is still computed and reported.

The update is torch's fused CPU AdamW (4.5x faster than foreach on our host; it is bound by host memory traffic,
not arithmetic), with the thread count set explicitly per rank.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from slidedp.config import OptimizerConfig, ScheduleConfig
from slidedp.step import trace
from slidedp.step.host_state import Board, HostState, wait_until
from slidedp.step.routes import ShardMap, sum_of_squares


def lr_at(step: int, total: int, opt: OptimizerConfig, sched: ScheduleConfig) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup, then constant / linear / cosine decay."""
    if sched.warmup_steps > 0 and step <= sched.warmup_steps:
        return opt.lr * step / sched.warmup_steps
    if sched.decay == "constant":
        return opt.lr
    span = max(1, total - sched.warmup_steps)
    progress = min(1.0, (step - sched.warmup_steps) / span)
    floor = sched.min_lr_ratio
    if sched.decay == "linear":
        factor = 1.0 - (1.0 - floor) * progress
    else:
        factor = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return opt.lr * factor


# Elements of a bf16-held gradient widened to fp32 at a time before their update: 16 MiB of fp32, small enough
# to be read back from the last-level cache by the update that follows the widening.
WIDEN_CHUNK = 1 << 22

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: keeps the factor finite for a zero norm


def clips(opt: OptimizerConfig) -> bool:
    """Whether the step clips to a global norm: optimizer.max_grad_norm > 0; 0 turns it off (and the updater then
    need not hold the gradients for the norm, which is still computed and reported)."""
    return opt.max_grad_norm > 0


def clip_coefficient(norm: torch.Tensor, max_grad_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The clip rule of a step, from its global gradient norm (a float64 scalar tensor on any device, so the
    device update applies it without a sync): (coef, skip).

    coef multiplies every gradient of the step: max_grad_norm / (norm + CLIP_EPS), at most 1, the factor of
    torch.nn.utils.clip_grad_norm_ (the division is a true float64 one, so the host's float and the device's
    tensor give the same bits). skip is True where the norm is inf or nan (a diverged step, slidedp.health): the
    step then updates no weight and no moment, whatever coef holds. Only for clips(opt).
    """
    coef = (torch.full_like(norm, max_grad_norm) / (norm + CLIP_EPS)).clamp(max=1.0)
    return coef, ~torch.isfinite(norm)


def adamw_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
           step: int, lr: float, opt: OptimizerConfig) -> None:
    """One AdamW step on flat fp32 host tensors (decoupled weight decay, bias correction)."""
    step_t = torch.tensor(float(step))
    torch._fused_adamw_([param], [grad], [exp_avg], [exp_avg_sq], [], [step_t], lr=lr, beta1=opt.betas[0],
                        beta2=opt.betas[1], weight_decay=opt.weight_decay, eps=opt.eps, amsgrad=False,
                        maximize=False)


def update_shard_(master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  delivery: torch.Tensor | None, step: int, lr: float, opt: OptimizerConfig) -> float:
    """The host update of one shard: AdamW, then its bf16 delivery copy (when given); calibration times this.

    The cast is a second pass over the master (AdamW 28 B/param + cast 6). Casting chunk by chunk right after each
    chunk's AdamW, to read the master from cache, measured no faster on the GPU machine (0.322 vs 0.324 s per 1e9
    params at 16 threads, chunks of 1M-16M elements: docs/notebook/perf-notes.md), so the passes stay whole.
    Returns the seconds the cast took (0 without one), which the metrics report apart from the AdamW pass.
    """
    adamw_(master, grad, exp_avg, exp_avg_sq, step, lr, opt)
    if delivery is None:
        return 0.0
    t0 = time.perf_counter()
    delivery.copy_(master)
    return time.perf_counter() - t0


@dataclass
class GradItem:
    seq: int  # per-rank handoff number, identical on every rank for the same (step, unit)
    step: int
    unit: int
    slot: int  # staging slot = seq % slots
    event: Any  # device event: the gradient is in staging once it has completed
    published: bool = False


@dataclass
class StepResult:
    step: int
    grad_norm: float
    clipped: bool
    update_busy_s: float
    cast_busy_s: float  # of update_busy_s: writing the bf16 delivery copy
    offcpu_s: float  # of update_busy_s: the updater thread off the CPU inside AdamW and the cast
    finished_at: float  # perf_counter when the last unit of the step was updated
    skipped: bool = False  # clipping found a non-finite norm: no unit was updated


class Updater(threading.Thread):
    def __init__(self, *, state: HostState, shards: ShardMap, grad_reduce: str, opt: OptimizerConfig,
                 sched: ScheduleConfig, total_steps: int, num_units: int,
                 threads: int | None = None, device_units: frozenset[int] = frozenset(), abort=None,
                 post_norm_passes: int = 1):
        super().__init__(name=f"slidedp-updater-{shards.rank}", daemon=True)
        self.state = state
        self.board = state.board
        self.shards = shards
        self.rank, self.world = shards.rank, shards.world
        self.host_route = grad_reduce == "host" and self.world > 1
        self.opt, self.sched, self.total_steps = opt, sched, total_steps
        self.num_units = num_units
        # units updated on the devices (slidedp.step.device_update): never handed to this thread
        self.host_units = [u for u in range(num_units) if u not in device_units]
        self.threads = threads
        self.abort = abort  # raises when the run is being torn down (a rank or the launcher failed)
        self.norm_on_device = grad_reduce == "gpu" or self.world == 1
        self.slots = state.layout.staging_slots
        self.deliver_bf16 = state.delivery is not state.master  # a bf16 copy the update must write
        self.clip = clips(opt)
        self.post_norm_passes = post_norm_passes  # policy.post_norm_passes: 2 = weights first (_post_norm)
        self._cond = threading.Condition()
        self._pending: deque[GradItem] = deque()
        self._backward_ended: set[int] = set()
        # steps whose every unit is updated on the devices: no gradient arrives here, yet each step's norm and
        # result must still be produced, or the rank waits for them forever
        self._empty_steps: deque[int] = deque()
        self._device_norm: dict[int, tuple] = {}
        # per step, the units streamed through the devices (slidedp.step.streamed_update) not yet marked updated,
        # each with the event after which its state is back in the host state; None while still being queued
        self._streamed: dict[int, dict[int, Any] | None] = {}
        self._stopping = False
        self.error: BaseException | None = None
        self.results: deque[StepResult] = deque()
        self._scratch = torch.empty(max(shards.shard_len(u) for u in range(num_units)) if self.host_route else 0)
        self._widen: torch.Tensor | None = None  # the post-norm passes' fp32 scratch chunks (_post_norm)
        self._unit_sumsq: dict[int, float] = {}
        self._done_units = 0
        self._busy = 0.0
        self._cast = 0.0  # seconds of _busy spent in the delivery cast
        self._offcpu = 0.0  # seconds of _busy in update_shard_ this thread spent off the CPU
        self._waited = 0.0  # seconds this thread waited inside _process (running total)
        self.last_step = 0  # last step whose every unit is updated on this rank's shards
        self._landed = 0.0  # when the gradient being processed was in hand (for the trace)

    # ------------------------------------------------------------------ main-thread side
    def submit(self, item: GradItem) -> None:
        with self._cond:
            self._pending.append(item)
            self._cond.notify()

    def end_backward(self, step: int, device_norm: tuple | None = None, streamed_pending: bool = False) -> None:
        """Backward of `step` is over. device_norm = (event, host scalar): the gpu route's global sum of squares,
        reduced on the GPUs; the host then neither reads the gradient for the norm nor exchanges partial sums.
        streamed_pending: some units of the step are updated by streaming through the device, and add_streamed()
        will say when each is back on the host (the step is not finished before it has)."""
        with self._cond:
            self._backward_ended.add(step)
            if device_norm is not None:
                self._device_norm[step] = device_norm
            if streamed_pending:
                self._streamed[step] = None
            if not self.host_units:
                self._empty_steps.append(step)
            self._cond.notify_all()

    def add_streamed(self, step: int, streamed: dict[int, Any]) -> None:
        """Per unit of `step` updated by streaming through the device, the event after which it is back on the
        host; this thread marks each updated once it has passed, between its own units' updates."""
        with self._cond:
            self._streamed[step] = dict(streamed)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"host update failed on rank {self.rank}") from self.error

    def wait_slot_free(self, seq: int, abort=None) -> float:
        """Before the device writes handoff `seq` into its staging slot: every reader is done with the old one."""
        slot, prev = seq % self.slots, seq - self.slots
        readers = range(self.world) if self.host_route else (self.rank,)
        return wait_until(lambda: all(self.board.read_done(r, self.rank, slot) >= prev for r in readers),
                          f"staging slot {slot} of rank {self.rank}", abort=abort)

    # ------------------------------------------------------------------ updater thread
    def run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)  # OpenMP thread counts are per calling thread
        try:
            self._wait_moments()
            while True:
                item = self._next_item()
                if item is None:
                    return
                if isinstance(item, int):  # a step with no unit to update here
                    self._finish_step(item)
                    continue
                t0, waited = time.perf_counter(), self._waited
                self._process(item)
                t1 = time.perf_counter()
                # busy = working: the waits for a gradient to land, for other ranks and for the norm are not
                self._busy += t1 - t0 - (self._waited - waited)
                if trace.TRACE is not None:
                    trace.TRACE.add("hold" if self.clip else "update", item.step, unit=item.unit, t0=t0,
                                    landed=self._landed, t1=t1)
                if self._done_units == len(self.host_units):
                    # after the unit's busy time is counted: the step's result carries it, with its off-CPU part
                    self._finish_step(item.step)
        except BaseException as exc:  # surfaced to the main thread through check()
            self.error = exc

    def _wait_moments(self) -> None:
        """Before anything writes the AdamW moments: fresh ones are paged in by the launcher meanwhile
        (slidedp.step.host_fill.MomentPager), and an update must not race its zeros."""
        t0 = time.perf_counter()
        wait_until(lambda: self.board.get(Board.MOMENTS_PAGING) != 1 or self._stopping,
                   "the launcher to page in the AdamW moments", timeout_s=math.inf, abort=self.abort)
        self._waited += time.perf_counter() - t0
        if self.board.get(Board.MOMENTS_PAGING) == 2:
            raise RuntimeError("the launcher failed to page in the AdamW moments (see its log)")

    def _publish_ready(self) -> None:
        # A gradient is announced as soon as its copy has landed, whatever this thread is busy with, so that
        # ranks reading each other's staging (host route) never wait on one another's processing order.
        with self._cond:
            items = list(self._pending)
        for it in items:
            if not it.published and it.event.query():
                it.published = True
                self.board.set_grad_seq(self.rank, it.slot, it.seq)

    def _next_item(self) -> GradItem | int | None:
        with self._cond:
            while not self._pending and not self._empty_steps and not self._stopping:
                self._cond.wait(timeout=0.05)
            if self._empty_steps:
                return self._empty_steps.popleft()
            if not self._pending:
                return None
            item = self._pending[0]
            ended = item.step in self._backward_ended
            # The lowest unit among the gradients that have landed (waiting on a copy still under way would idle
            # this thread while others are ready); none landed: the first handed over, whose copy lands first.
            # Once the backward is over, so that the next forward's first units are ready first. During it, so that
            # what is left when it ends is spread up to the top layers rather than the bottom ones and the next
            # forward runs ahead with the updater (Qwen3-4B, micro-batch 4, 24 GiB, one GPU: 1.102 s a step
            # against 1.206 s taking them as handed over, docs/benchmarks.md); but not when one of the backward's
            # next two handoffs would wait for the oldest one's staging slot (a ring): then the oldest.
            if ended or item.seq > self._pending[-1].seq + 2 - self.slots:
                same = [it for it in self._pending if it.step == item.step]
                landed = [it for it in same if it.published or it.event.query()]
                if landed:
                    item = min(landed, key=lambda it: it.unit)
        return item

    def _remove(self, item: GradItem) -> None:
        with self._cond:
            self._pending.remove(item)

    def _reduced_gradient(self, item: GradItem) -> torch.Tensor:
        lo, hi = self.shards.own_range(item.unit)
        t0 = time.perf_counter()
        item.event.synchronize()
        self._waited += time.perf_counter() - t0
        if not item.published:
            item.published = True
            self.board.set_grad_seq(self.rank, item.slot, item.seq)
        if not self.host_route:
            # gpu route: this rank's shard, already summed, at the start of its slot
            return self.state.staging_slot(self.rank, item.slot)[: hi - lo]
        self._waited += wait_until(lambda: (self._publish_ready() or True)
                                   and all(self.board.grad_seq(o, item.slot) >= item.seq for o in range(self.world)),
                                   f"gradients of unit {item.unit} from every rank")
        g = self._scratch[: hi - lo]
        g.copy_(self.state.staging_slot(0, item.slot)[lo:hi])
        for o in range(1, self.world):
            g.add_(self.state.staging_slot(o, item.slot)[lo:hi])
        return g

    def _release(self, item: GradItem) -> None:
        owners = range(self.world) if self.host_route else (self.rank,)
        for o in owners:
            self.board.set_read_done(self.rank, o, item.slot, item.seq)

    def _update_unit(self, unit: int, grad: torch.Tensor, step: int) -> None:
        lo, hi = self.shards.own_range(unit)
        if hi > lo:
            self._update_range(unit, lo, hi, grad, step)
        self.board.set_updated(unit, self.rank, step)

    def _update_range(self, unit: int, lo: int, hi: int, grad: torch.Tensor, step: int) -> None:
        """AdamW (and the bf16 copy) on elements [lo, hi) of the unit, from grad (fp32, hi - lo elements)."""
        lr = lr_at(step, self.total_steps, self.opt, self.sched)
        delivery = self.state.delivery_unit(unit)[lo:hi] if self.deliver_bf16 else None
        # This thread is a member of the update's OpenMP team, so it is on a CPU for the whole call but for
        # blocking: the rest of the wall time is what the call lost waiting — at the team's barrier for a
        # slower member, or to get the GIL back (on the GPU machine the former: docs/notebook/perf-notes.md).
        t0, c0 = time.perf_counter(), time.thread_time()
        self._cast += update_shard_(self.state.master_unit(unit)[lo:hi], grad,
                                    self.state.exp_avg_unit(unit)[lo:hi], self.state.exp_avg_sq_unit(unit)[lo:hi],
                                    delivery, step, lr, self.opt)
        self._offcpu += max(0.0, (time.perf_counter() - t0) - (time.thread_time() - c0))

    def _mark_streamed(self, step: int, block: bool) -> None:
        """Mark updated the streamed units of `step` whose state is back on the host (block: wait for all)."""
        if block:  # the step's streamed updates may still be being queued (end_backward, then add_streamed)
            self._waited += wait_until(lambda: self._streamed.get(step, {}) is not None,
                                       "the streamed layers' updates to be queued", abort=self.abort)
        with self._cond:
            pending = self._streamed.get(step) or {}
        for u in sorted(pending):
            if block:
                t0 = time.perf_counter()
                pending[u].synchronize()
                self._waited += time.perf_counter() - t0
            elif not pending[u].query():
                continue
            self.board.set_updated(u, self.rank, step)
            if trace.TRACE is not None:
                trace.TRACE.add("streamed", step, unit=u, t=trace.now())
            del pending[u]
        if block:
            with self._cond:
                self._streamed.pop(step, None)

    def _post_norm_scratch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gradient, moment 1, moment 2, parameter) scratch chunks of WIDEN_CHUNK fp32 elements (_post_norm)."""
        if self._widen is None:
            self._widen = torch.zeros(4, WIDEN_CHUNK, dtype=torch.float32)
        return self._widen[0], self._widen[1], self._widen[2], self._widen[3]

    def _post_norm(self, u: int, step: int, coef: float, what: str) -> None:
        """Unit u's update after the norm, from its held gradient scaled by the clip factor: all of it (`what`
        "whole"), or one of its two passes ("weights", then once every unit's weights are done "moments";
        policy.post_norm_passes 2).

        The next forward needs the unit's new weights; its new moments are needed only by its next update. So
        the weights pass runs AdamW with the parameters in place and the moments copied into a cache-sized
        scratch, whose new values it drops, then writes the bf16 delivery copy, and marks the unit updated; the
        moments pass runs the same AdamW on the same chunks of the same gradient with a scratch parameter and the
        moments in place. The same inputs through the same kernel in the same chunks give the moments the bits
        the weights pass used (and the whole update's). The next forward then waits for 20 B/param of AdamW's 28
        (the moments' reads, not their writes) and the moments' write-back runs beside it; measured, copying the
        moments into the scratch costs the weights pass more than that saves, so AutoPolicy keeps one pass
        (docs/planning.md).

        A gradient held in bf16 (slidedp.step.layout.held_in_bf16) is widened to fp32 a chunk at a time into the
        scratch, and scaled there, in each pass (exact, and elementwise); one held in fp32 is scaled in place by
        the first pass and read as scaled by the moments pass."""
        lo, hi = self.shards.own_range(u)
        held = self.state.held_unit(u)[lo:hi]
        widened = held.dtype != torch.float32
        if what != "moments" and not widened and coef < 1.0:
            held.mul_(coef)
        master, m1, m2 = self.state.master_unit(u), self.state.exp_avg_unit(u), self.state.exp_avg_sq_unit(u)
        delivery = self.state.delivery_unit(u) if self.deliver_bf16 and what != "moments" else None
        lr = lr_at(step, self.total_steps, self.opt, self.sched)
        sg, s1, s2, sp = self._post_norm_scratch()
        for a in range(0, hi - lo, WIDEN_CHUNK):
            k = min(WIDEN_CHUNK, hi - lo - a)
            r = slice(lo + a, lo + a + k)
            # This thread is a member of every call's OpenMP team: off the CPU inside them is what it lost waiting
            # at the team's barrier or for the GIL (as in _update_range)
            t0, c0 = time.perf_counter(), time.thread_time()
            if widened:
                g = sg[:k]
                g.copy_(held[a : a + k])
                if coef < 1.0:
                    g.mul_(coef)
            else:
                g = held[a : a + k]
            param, e1, e2 = master[r], m1[r], m2[r]
            if what == "weights":  # the moments' new values land in the scratch and are dropped
                s1[:k].copy_(e1)
                s2[:k].copy_(e2)
                e1, e2 = s1[:k], s2[:k]
            elif what == "moments":  # the parameters' new values land in the scratch and are dropped
                param = sp[:k]
            self._cast += update_shard_(param, g, e1, e2, None if delivery is None else delivery[r], step, lr,
                                        self.opt)
            self._offcpu += max(0.0, (time.perf_counter() - t0) - (time.thread_time() - c0))
        if what != "moments":
            self.board.set_updated(u, self.rank, step)

    def _process(self, item: GradItem) -> None:
        g = self._reduced_gradient(item)
        self._landed = time.perf_counter()  # the gradient is here: what came before was waiting for it
        if not self.norm_on_device:
            # per unit, summed in unit order at the end: the processing order depends on timing and float
            # addition is not associative, so a running total would differ in its last bits run to run
            self._unit_sumsq[item.unit] = float(sum_of_squares(g))
        if self.clip:
            lo, hi = self.shards.own_range(item.unit)
            self.state.held_unit(item.unit)[lo:hi].copy_(g)
            self._release(item)
        else:
            self._update_unit(item.unit, g, item.step)
            self._release(item)
        self._remove(item)
        self._done_units += 1

    def _finish_step(self, step: int) -> None:
        board = self.board
        if self.norm_on_device:
            t0 = time.perf_counter()
            wait_until(lambda: step in self._device_norm, "the end of backward")
            event, host_scalar = self._device_norm.pop(step)
            event.synchronize()
            self._waited += time.perf_counter() - t0
            norm = math.sqrt(float(host_scalar))
        else:
            board.publish_norm(self.rank, step, sum(self._unit_sumsq[u] for u in sorted(self._unit_sumsq)))
            self._waited += wait_until(lambda: all(board.norm_seq(r) >= step for r in range(self.world)),
                                       "the gradient norm")
            norm = math.sqrt(sum(board.norms(step)))
        clipped = skipped = False
        if self.clip:
            coef_t, skip_t = clip_coefficient(torch.tensor(norm, dtype=torch.float64), self.opt.max_grad_norm)
            skipped, coef = bool(skip_t), float(coef_t)
        if skipped:
            # a diverged step (slidedp.health): the held gradients are dropped and no unit is updated, so the host
            # state stays that of the last good step; the units are marked done so no one waits for them
            for u in self.host_units:
                self.board.set_updated(u, self.rank, step)
        elif self.clip:
            clipped = coef < 1.0
            # two passes: every unit's new weights, then their moments (_post_norm); one: each unit's whole update
            passes = ("weights", "moments") if self.post_norm_passes == 2 else ("whole",)
            for what in passes:
                for u in self.host_units:  # forward order: unit 0 is the next forward's first need
                    t0, off0 = time.perf_counter(), self._offcpu
                    self._post_norm(u, step, coef, what)
                    t1 = time.perf_counter()
                    self._busy += t1 - t0
                    if trace.TRACE is not None:
                        trace.TRACE.add("moments" if what == "moments" else "final", step, unit=u, t0=t0, t1=t1,
                                        offcpu=self._offcpu - off0)
                    self._mark_streamed(step, block=False)
        self._mark_streamed(step, block=True)
        self.results.append(StepResult(step, norm, clipped, self._busy, self._cast, self._offcpu,
                                       time.perf_counter(), skipped))
        self.last_step = step
        self._unit_sumsq, self._done_units, self._busy, self._cast, self._offcpu = {}, 0, 0.0, 0.0, 0.0
