"""The engine's program as the overlap model (planning/overlap.py) replays it: every piece of work of two training
steps of one rank as a task on the resource that runs it, after the tasks it waits for. Imports no torch.

The program follows slidedp/step (engine, window, routes, optimizer) in the order the rank's Python thread issues it:
the step's schedule and the window's deliveries come from slidedp.schedule, as the engine's do. The host is a cursor
through the program: work it enqueues on a stream cannot start before the point where it was issued, and where the
engine blocks (a unit's first delivery of a step waits for its previous update; a gradient handoff waits for its
staging slot) the cursor waits too. A task's duration here is what it takes alone (Durations, from calibration);
planning/overlap.py places the tasks and slows those that share a pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slidedp.schedule import step_schedule, window_plan

# The resources that run their tasks in the order issued (the updater, `cpu`, picks its own order: overlap.py)
IN_ORDER = ("host", "compute", "h2d", "d2h", "coll", "stream")


@dataclass
class Durations:
    """Seconds (and shared-pool bytes) of every piece of work; built by cost_model.Rates for one job+policy."""

    world: int
    units: list[int]  # params per unit: embedding, layers 1..L, head
    activations: list[str]  # per decoder layer
    resident: list[bool]
    window: int
    staging_slots: int
    micro_batches: int
    clip: bool
    sharded: bool
    gpu_reduce: bool
    embed_fwd: float
    embed_bwd: float
    head: float  # loss head forward+backward of one micro-batch
    layer_fwd: dict[str, float]  # by activation policy
    layer_bwd: dict[str, float]
    deliver: list[float]  # per unit: this rank's H2D seconds
    deliver_bytes: list[float]
    all_gather: list[float]  # per unit (sharded)
    grad_d2h: list[float]
    grad_bytes: list[float]
    reduce_scatter: list[float]
    act_d2h: float  # offloaded activations of one layer, out and back
    act_h2d: float
    act_bytes: float
    update: list[float]  # per unit: the host update of every shard (aggregate over ranks); clip: its weights pass
    update_bytes: list[float]
    hold: list[float]  # clip: per unit work while gradients arrive (norm + keep)
    hold_bytes: list[float]
    collective_loads: dict[str, float] = field(
        default_factory=dict
    )  # pool bytes per collective byte (no P2P)
    coll_bytes: list[float] = field(default_factory=list)
    # per unit: AdamW and all-gather on the device (edge_update gpu, device_layers); 0 for host-updated units
    device_update: list[float] = field(default_factory=list)
    # per unit: its update streamed through the device after the norm (policy.streamed_layers), seconds alone on
    # the link, and the bytes it moves over the link (and host DRAM); 0 for every other unit
    streamed: list[float] = field(default_factory=list)
    streamed_bytes: list[float] = field(default_factory=list)
    streamed_in_bytes: list[float] = field(default_factory=list)  # of streamed_bytes, host->GPU (the rest GPU->host)
    # streamed units whose updated weights stay on the device for the next forward (delivered by a device copy of
    # `device_copy` seconds, and the all-gather of sharded delivery: slidedp.step.streamed_update)
    weights_kept: frozenset = frozenset()
    device_copy: list[float] = field(default_factory=list)
    # clip: per unit, the post-norm update's moments pass, after every unit's weights pass (`update`)
    moments: list[float] = field(default_factory=list)
    moments_bytes: list[float] = field(default_factory=list)
    # per unit: the compute stream's work on a decoder layer's gradient after its backward in each micro-batch
    # (the buffer zeroed, accumulated or widened for the trip: cost_model.Rates.gradient_out_s); empty: none
    gradient_out: list[float] = field(default_factory=list)
    dram_capacity: float | None = None  # bytes/s
    # host memory's share for the host update against copies, per byte of demand (pools.slowdowns)
    dram_update_weight: float = 1.0
    # bytes/s that copies move together while the host update runs (pools._beside_update); None: not measured
    copies_beside_update: float | None = None
    pcie_capacity: float | None = None  # bytes/s, both directions of one GPU's link
    # bytes/s of one direction of one GPU's link (host->GPU, GPU->host): what one direction's copies share
    h2d_capacity: float | None = None
    d2h_capacity: float | None = None
    cpu_mode: bool = False  # CPU training: one thread does compute, copies and collectives in order
    # clip: the updater's time after the norm before its first post-norm unit has run at its rate, beyond that
    # unit's charge (cost_model.POST_NORM_START_S); no pool's load
    post_norm_start: float = 0.0
    # a delivery over the link with the bf16 cast on the GPU runs this many times longer while the compute stream
    # runs (cost_model.Rates.cast_beside_compute); 1: no cast, or not measured
    cast_beside_compute: float = 1.0
    zero: frozenset = frozenset()  # kinds made free (to measure exposure)


class Task:
    """One piece of work on one resource; its start, end and binding (the task it waited for last) are
    the scheduler's, set by each placement."""

    __slots__ = (
        "kind",
        "res",
        "base",
        "dur",
        "deps",
        "start",
        "end",
        "binding",
        "loads",
        "unit",
        "step",
        "phase",
        "order",
        "dependents",
        "waiting",
    )

    def __init__(
        self,
        kind: str,
        res: str,
        dur: float,
        deps: list,
        *,
        unit: int = -1,
        step: int = 0,
        phase: str = "",
        loads: dict[str, float] | None = None,
    ):
        self.kind, self.res, self.base, self.dur = kind, res, dur, dur
        self.deps = [d for d in deps if d is not None]
        self.start: float | None = None
        self.end: float | None = None
        self.binding: Task | None = None
        self.loads = loads or {}
        self.unit, self.step, self.phase = unit, step, phase
        self.order = 0
        self.dependents: list[Task] = []  # tasks with this one among their deps (once per occurrence)
        self.waiting = 0  # deps not yet placed in the current pass


class Program:
    """The tasks of two steps and what the scheduler needs to know of them: the in-order resources' queues, the
    updater's tasks in hand-over order and who handed each over, and the tasks a step is measured from."""

    STEPS = 2

    def __init__(self, d: Durations):
        self.d = d
        self.tasks: list[Task] = []
        self.queues: dict[str, list[Task]] = {r: [] for r in IN_ORDER}
        self.cpu_tasks: list[Task] = []
        self.submit: dict[int, Task] = {}  # cpu task order -> host task that handed it to the updater
        self.seq: dict[int, int] = {}  # cpu task order -> its handoff number (its staging slot is seq % slots)
        self.updated: dict[tuple[int, int], Task] = {}  # (step, unit) -> task after which it is updated
        self.final: dict[int, list[Task]] = {}  # clip: the forward-order updates after the norm (both passes)
        self.holds_per_step: dict[int, int] = {}
        self.end_backward: dict[int, Task] = {}
        self.backward_last: dict[int, Task] = {}
        self.forward_first: dict[int, Task] = {}  # each step's first micro-batch's last forward task
        self.device_updated: dict[int, Task] = {}  # each step's device update on the compute stream, if any
        self.cursor: Task | None = None
        # units updated on the device (policy.edge_update gpu, policy.device_layers)
        self.on_device = {u for u, t in enumerate(d.device_update) if t > 0}
        self.streamed = {u for u, t in enumerate(d.streamed) if t > 0}
        self._build()
        for t in self.tasks:
            for x in t.deps:
                x.dependents.append(t)
        self.submitted_by = [self.submit[t.order] for t in self.cpu_tasks]  # hand-over order

    # ------------------------------------------------------------------ task creation
    def _new(self, kind: str, res: str, dur: float, deps: list, unit: int = -1, step: int = 0, phase: str = "",
             loads: dict[str, float] | None = None) -> Task:
        if self.d.cpu_mode:
            if res in ("h2d", "d2h", "coll", "stream"):
                res = "compute"  # CPU training: no streams, the rank's thread does everything in order
            if res in ("compute", "cpu"):
                loads = {**(loads or {}), "cores": 0.0 if kind in self.d.zero else dur}
        if kind in self.d.zero:
            dur = 0.0
        t = Task(kind, res, dur, deps, unit=unit, step=step, phase=phase, loads=loads)
        t.order = len(self.tasks)
        self.tasks.append(t)
        (self.cpu_tasks if res == "cpu" else self.queues[res]).append(t)
        return t

    def _gpu(self, kind: str, res: str, dur: float, deps: list, **kw: Any) -> Task:
        """Work the host enqueues at its current point in the program (it cannot start before that)."""
        return self._new(kind, res, dur, [self.cursor, *deps], **kw)

    def _host_wait(self, deps: list) -> None:
        """The host blocks here until deps are done; everything it issues later comes after."""
        deps = [x for x in deps if x is not None]
        if deps:
            self.cursor = self._new("host", "host", 0.0, [self.cursor, *deps])

    def _dma(self, h2d: float = 0.0, d2h: float = 0.0) -> dict[str, float]:
        # Every rank moves the same bytes at the same time: host DRAM sees all of them, a PCIe link one rank's
        # (both directions together), and `h2d` bytes go host->GPU and `d2h` GPU->host, each direction a pool too
        nbytes = h2d + d2h
        loads = {"dram": nbytes * self.d.world, "pcie": nbytes}
        if h2d:
            loads["h2d"] = h2d
        if d2h:
            loads["d2h"] = d2h
        return loads

    # ------------------------------------------------------------------ the engine's program
    def _deliver(self, u: int, s: int, free: Task | None) -> Task:
        d = self.d
        if s > 0 and u in d.weights_kept:
            # a streamed layer's weights stay on the device after its update: a device copy behind that update, on
            # the stream deliveries use, with no wait of the host and nothing over the link
            t = self._gpu("deliver", "h2d", d.device_copy[u], [free, self.updated[(s - 1, u)]], unit=u, step=s)
        else:
            if s > 0:
                self._host_wait([self.updated[(s - 1, u)]])
            t = self._gpu(
                "deliver", "h2d", d.deliver[u], [free], unit=u, step=s,
                loads=self._dma(h2d=d.deliver_bytes[u])
            )
        if d.sharded:
            loads = {k: v * d.coll_bytes[u] for k, v in d.collective_loads.items()}
            t = self._gpu("all_gather", "h2d", d.all_gather[u], [t], unit=u, step=s, loads=loads)
        return t

    def _send(self, u: int, s: int, src: Task, state: dict) -> None:
        """Gradient handoff of unit u: staging slot, reduce-scatter / copy out, then the host update."""
        d = self.d
        state["seq"] += 1
        seq = state["seq"]
        self._host_wait([state["released"].get(seq - d.staging_slots)])
        submit = self._new("host", "host", 0.0, [self.cursor])
        self.cursor = submit
        deps: list = [src]
        if d.gpu_reduce:
            loads = {k: v * d.coll_bytes[u] * 2 for k, v in d.collective_loads.items()}
            deps = [
                self._gpu("reduce_scatter", "coll", d.reduce_scatter[u], [src], unit=u, step=s, loads=loads)
            ]
        out = self._gpu(
            "grad_out", "d2h", d.grad_d2h[u], deps, unit=u, step=s,
            loads=self._dma(d2h=d.grad_bytes[u])
        )
        state["gdone"][state["parity"]] = out
        state["last_d2h"] = out
        if d.clip:
            work = self._new("hold", "cpu", d.hold[u], [out], unit=u, step=s, loads={"dram": d.hold_bytes[u]})
            self.holds_per_step[s] = self.holds_per_step.get(s, 0) + 1
        else:
            work = self._new(
                "update", "cpu", d.update[u], [out], unit=u, step=s, loads={"dram": d.update_bytes[u]}
            )
            self.updated[(s, u)] = work
        self.submit[work.order] = submit
        self.seq[work.order] = seq
        state["released"][seq] = work

    def _device_reduce(self, u: int, s: int, src: Task, state: dict, parity: bool = False) -> None:
        """A unit updated on the device: its gradient is reduce-scattered on the d2h stream and stays there (a
        layer's comes from a parity buffer, reused after the reduction)."""
        loads = {k: v * self.d.coll_bytes[u] * 2 for k, v in self.d.collective_loads.items()}
        t = self._gpu("reduce_scatter", "d2h", self.d.reduce_scatter[u], [src], unit=u, step=s, loads=loads)
        state["last_d2h"] = t
        if parity:
            state["gdone"][state["parity"]] = t
        state.setdefault("device_reduced", []).append(t)

    def _next_parity(self, state: dict) -> None:
        # the compute stream reuses a parity's gradient buffers only after their last transfer out
        state["parity"] ^= 1
        state["wait"].append(state["gdone"][state["parity"]])

    def _compute(self, kind_phase: str, dur: float, deps: list, u: int, s: int, state: dict) -> Task:
        waits, state["wait"] = state["wait"], []
        return self._gpu("compute", "compute", dur, [*deps, *waits], unit=u, step=s, phase=kind_phase)

    def _get(
        self,
        k: int,
        schedule: list[int],
        plan: list[tuple],
        by_get: dict[int, list[int]],
        ready: list,
        done: list,
        dedicated_ready: dict[int, Task],
        s: int,
    ) -> Task | None:
        """Window.get(k): issue the deliveries up to the horizon, each after its unit's previous update."""
        for j in by_get.get(k, []):
            uj, p = schedule[j], plan[j]
            if p[0] == "d":
                if uj in self.on_device:  # updated in place on the compute stream: in order, nothing to wait for
                    ready[j] = None
                    continue
                if p[1]:
                    dedicated_ready[uj] = self._deliver(uj, s, None)
                ready[j] = dedicated_ready[uj]
            elif p[2]:
                ready[j] = self._deliver(uj, s, done[p[3]] if p[3] >= 0 else None)
            else:
                ready[j] = ready[p[4]]
        return ready[k]

    def _build(self) -> None:
        d = self.d
        L = len(d.units) - 2
        head = L + 1
        M = d.micro_batches
        schedule = step_schedule(L, M)
        dedicated = {0, head} | {i + 1 for i, r in enumerate(d.resident) if r}
        plan, issued_at = window_plan(schedule, dedicated, d.window)
        by_get: dict[int, list[int]] = {}
        for j, k in enumerate(issued_at):
            by_get.setdefault(k, []).append(j)
        state: dict[str, Any] = {
            "seq": 0,
            "released": {},
            "gdone": [None, None],
            "parity": 0,
            "wait": [],
            "last_d2h": None,
        }
        for s in range(self.STEPS):
            ready: list[Task | None] = [None] * len(schedule)
            done: list[Task | None] = [None] * len(schedule)
            dedicated_ready: dict[int, Task] = {}
            state["wait"] += list(state["gdone"])  # gE / gH reuse at the start of a step
            k = 0
            win = (schedule, plan, by_get, ready, done, dedicated_ready, s)

            def get(k: int, win: tuple = win) -> Task | None:
                return self._get(k, *win)

            sent: dict[int, Task] = {}  # an offloaded layer's activations on their way out
            fetched: dict[int, Task] = {}  # ... and on their way back, fetched after their own copy out

            def fetch(u: int, after: Task | None = None, sent: dict = sent, fetched: dict = fetched,
                      s: int = s) -> None:
                # into the slot the backward two layers up read last (`after`): rewritten once that is done
                if u >= 1 and u in sent:
                    deps = [sent.pop(u)] + ([after] if after is not None else [])
                    fetched[u] = self._gpu(
                        "fetch", "h2d", d.act_h2d, deps, unit=u, step=s,
                        loads=self._dma(h2d=d.act_bytes)
                    )

            for m in range(M):
                last = m == M - 1
                if m == 0:
                    done[k] = self._compute("forward", d.embed_fwd, [get(k)], 0, s, state)
                    k += 1
                    embed = done[k - 1]
                else:
                    embed = self._compute("forward", d.embed_fwd, [], 0, s, state)
                for u in range(1, L + 1):
                    pol = d.activations[u - 1]
                    done[k] = self._compute("forward", d.layer_fwd[pol], [get(k)], u, s, state)
                    if pol == "offload":
                        sent[u] = self._gpu(
                            "act_out", "d2h", d.act_d2h, [done[k]], unit=u, step=s,
                            loads=self._dma(d2h=d.act_bytes)
                        )
                    k += 1
                fetch(L)  # the first layer back comes home under the loss head
                if m == 0:
                    self.forward_first[s] = done[k - 1]
                    k_head = k
                    head_ready = get(k)
                    k += 1
                h = self._compute("backward", d.head, [head_ready], head, s, state)
                done[k_head] = h
                if last and head in self.on_device:
                    self._device_reduce(head, s, h, state)
                elif last:
                    self._next_parity(state)
                    self._send(head, s, h, state)
                for u in range(L, 0, -1):
                    r = get(k)
                    self._next_parity(state)
                    pol = d.activations[u - 1]
                    fetch(u - 1, done[k - 1] if u < L else None)  # one layer ahead, behind this delivery
                    deps = [r] + ([fetched.pop(u)] if u in fetched else [])
                    work = d.layer_bwd[pol] + (d.gradient_out[u] if d.gradient_out else 0.0)
                    done[k] = self._compute("backward", work, deps, u, s, state)
                    if last and (u in self.on_device or u in self.streamed):
                        self._device_reduce(u, s, done[k], state, parity=True)
                    elif last:
                        self._send(u, s, done[k], state)
                    k += 1
                e = self._compute("backward", d.embed_bwd, [embed], 0, s, state)
                if last:
                    self.backward_last[s] = e
                    if 0 in self.on_device:
                        self._device_reduce(0, s, e, state)
                    else:
                        self._next_parity(state)
                        self._send(0, s, e, state)
            self.end_backward[s] = self._new("host", "host", 0.0, [self.cursor])
            self.cursor = self.end_backward[s]
            reduced = state.pop("device_reduced", [])
            if self.on_device:
                # after the backward, on the compute stream: AdamW of every device-updated shard and the
                # all-gathers; with clipping it waits for the global norm, i.e. for every gradient transfer of the step
                deps = reduced + ([state["last_d2h"]] if d.clip else [])
                self.device_updated[s] = self._compute("backward", sum(d.device_update[u] for u in self.on_device),
                                                       deps, 0, s, state)
            for u in sorted(self.streamed):
                # on streams of their own, in forward order, after the norm (every gradient transfer of the step):
                # the link's both directions shared with the next forward's deliveries; the chunks coming in share
                # the host->GPU direction with those deliveries, the results going out the other one
                nbytes, inb = d.streamed_bytes[u], d.streamed_in_bytes[u]
                self.updated[(s, u)] = self._gpu("streamed", "stream", d.streamed[u], [state["last_d2h"]], unit=u,
                                                 step=s, loads=self._dma(h2d=inb, d2h=nbytes - inb))
            self.final[s] = []
            if d.clip:
                # the norm is known once the whole backward is over (the GPUs reduce it after the last layer's
                # backward, device-updated layers included): no update before, even with every held gradient in
                norm = [self.backward_last[s]]
                # in forward order; in two passes (policy.post_norm_passes 2, slidedp.step.optimizer.Updater
                # ._post_norm) every unit's new weights, then every unit's moments, before the updater takes the
                # next step's first gradient
                host = [u for u in range(len(d.units)) if u not in self.on_device and u not in self.streamed]
                if host and d.post_norm_start:
                    lag = Task("post_norm_start", "cpu", 0.0 if "post_norm_start" in d.zero else d.post_norm_start,
                               norm, step=s)
                    lag.order = len(self.tasks)
                    self.tasks.append(lag)
                    self.final[s].append(lag)
                passes = [("final", d.update, d.update_bytes)]
                if any(d.moments):  # policy.post_norm_passes 2
                    passes.append(("moments", d.moments, d.moments_bytes))
                for kind, secs, nbytes in passes:
                    for u in host:
                        f = Task(kind, "cpu", 0.0 if kind in d.zero else secs[u], norm, unit=u, step=s)
                        f.base = f.dur
                        f.loads = {"dram": nbytes[u], **({"cores": f.dur} if d.cpu_mode else {})}
                        f.order = len(self.tasks)
                        self.tasks.append(f)
                        self.final[s].append(f)
                        if kind == "final":
                            self.updated[(s, u)] = f
