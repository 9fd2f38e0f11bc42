"""The overlap model of the pipeline: a discrete-event replay of two training steps of one rank.

Imports no torch. The engine's program (slidedp/step: engine, window, routes, optimizer) is replayed with
durations from calibration instead of real work, on the resources that run concurrently:

  host     the rank's Python thread: issues everything in program order and blocks where the engine blocks
           (before a unit's first delivery of a step until its previous update is done; before a gradient
           handoff until its staging slot is free)
  compute  the compute stream (forward, loss head, backward, recompute)
  h2d      the host->GPU copy stream: parameter deliveries, the sharded route's all-gather (the stream waits
           for it), offloaded activations coming back
  d2h      the GPU->host copy stream: gradients, offloaded activations going out
  coll     the gradient collectives (reduce-scatter)
  cpu      the host update of every rank's shard (ranks are symmetric, so one resource stands for all of them):
           the lowest landed unit first (during the backward unless a handoff would wait for the oldest one's
           slot), as the updater does

Ranks are symmetric, so one rank is replayed; its transfers stand for N identical ones when they share host
memory. Shared bandwidth is modelled as pools with a capacity: host DRAM (CPU update, host reduction and every
rank's PCIe copies) and each GPU's PCIe link (both directions at once, and each direction alone: the streamed
update's copies in share the host->GPU direction with the deliveries, at one direction's bandwidth; planning/
pools.py). A task that overlaps others in a pool whose total demand exceeds the capacity is slowed by demand /
capacity (proportional sharing, which reproduces the measured AdamW-vs-DMA contention); the replay is repeated
with the slowed durations until it settles. In CPU
training (no streams: the rank's thread computes and copies in order) the rank's cores are a pool too: its
compute and its updater each use all of them, so while both run each goes at half speed.

Step time is the period between the ends of two consecutive backward passes (the second step, which starts
with the first step's leftover updates: the steady state). That period is split into phases on the compute
stream: busy forward / backward (the loss head counts as backward, as the engine measures it), and idle time
traced back along what the compute stream waited for: a host update -> `update_tail`, a transfer ->
`delivery_wait`.

A step of many micro-batches is extended from two short replays by planning/long_step.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slidedp.planning.pools import capacities, pool_users, slowdowns
from slidedp.schedule import step_schedule, window_plan

IN_ORDER = ("host", "compute", "h2d", "d2h", "coll", "stream")
_HOST = IN_ORDER.index("host")
UPDATE_KINDS = frozenset({"update", "hold", "final", "streamed"})  # host-update work: waits on it are `update_tail`
# Groups of task kinds that can be made free to measure a resource's exposure.
EXPOSURE_KINDS = {
    "h2d": frozenset({"deliver", "fetch"}),
    "d2h": frozenset({"grad_out", "act_out"}),
    "collective": frozenset({"all_gather", "reduce_scatter"}),
    "cpu_update": UPDATE_KINDS,
}


class _Task:
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
        self.binding: _Task | None = None
        self.loads = loads or {}
        self.unit, self.step, self.phase = unit, step, phase
        self.order = 0
        self.dependents: list[_Task] = []  # tasks with this one among their deps (once per occurrence)
        self.waiting = 0  # deps not yet placed in the current pass


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
    update: list[float]  # per unit: the host update of every shard (aggregate over ranks)
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
    dram_capacity: float | None = None  # bytes/s
    pcie_capacity: float | None = None  # bytes/s, both directions of one GPU's link
    # bytes/s of one direction of one GPU's link (host->GPU, GPU->host): what one direction's copies share
    h2d_capacity: float | None = None
    d2h_capacity: float | None = None
    cpu_mode: bool = False  # CPU training: one thread does compute, copies and collectives in order
    zero: frozenset = frozenset()  # kinds made free (to measure exposure)


@dataclass
class Outcome:
    step_time_s: float
    phases: dict[str, float]
    busy: dict[str, float]  # seconds each resource worked during the measured step
    tasks: int
    # the step cut as the engine measures it (waits included): step start -> end of the first micro-batch's
    # forward, then -> end of the last backward; comparable with a metrics record's measured phases
    spans: dict[str, float] = field(default_factory=dict)
    replayed: int = 0  # tasks actually placed (a long step is extended from two shorter replays)


_NEVER_READY = _Task("end", "host", 0.0, [])
_NEVER_READY.waiting = 1  # no task counts it among its deps, so it never becomes ready

# ---------------------------------------------------------------------------- building the replay
class _Replay:
    STEPS = 2

    def __init__(self, d: Durations):
        self.d = d
        self.tasks: list[_Task] = []
        self.queues: dict[str, list[_Task]] = {r: [] for r in IN_ORDER}
        self.cpu_tasks: list[_Task] = []
        self.submit: dict[int, _Task] = {}  # cpu task order -> host task that handed it to the updater
        self.seq: dict[int, int] = {}  # cpu task order -> its handoff number (its staging slot is seq % slots)
        self.updated: dict[tuple[int, int], _Task] = {}  # (step, unit) -> task after which it is updated
        self.final: dict[int, list[_Task]] = {}  # clip: the forward-order updates after the norm
        self.holds_per_step: dict[int, int] = {}
        self.end_backward: dict[int, _Task] = {}
        self.backward_last: dict[int, _Task] = {}
        self.forward_first: dict[int, _Task] = {}  # each step's first micro-batch's last forward task
        self.device_updated: dict[int, _Task] = {}  # each step's device update on the compute stream, if any
        self.cursor: _Task | None = None
        # units updated on the device (policy.edge_update gpu, policy.device_layers)
        self.on_device = {u for u, t in enumerate(d.device_update) if t > 0}
        self.streamed = {u for u, t in enumerate(d.streamed) if t > 0}
        self._build()
        for t in self.tasks:
            for x in t.deps:
                x.dependents.append(t)
        self.submitted_by = [self.submit[t.order] for t in self.cpu_tasks]  # hand-over order
        # the in-order queues in IN_ORDER, each ended by a task that is never ready, so that a drain needs no
        # bounds check
        self._ends_blocked = [[*self.queues[r], _NEVER_READY] for r in IN_ORDER]

    # ------------------------------------------------------------------ task creation
    def _new(self, kind: str, res: str, dur: float, deps: list, unit: int = -1, step: int = 0, phase: str = "",
             loads: dict[str, float] | None = None) -> _Task:
        if self.d.cpu_mode:
            if res in ("h2d", "d2h", "coll", "stream"):
                res = "compute"  # CPU training: no streams, the rank's thread does everything in order
            if res in ("compute", "cpu"):
                loads = {**(loads or {}), "cores": 0.0 if kind in self.d.zero else dur}
        if kind in self.d.zero:
            dur = 0.0
        t = _Task(kind, res, dur, deps, unit=unit, step=step, phase=phase, loads=loads)
        t.order = len(self.tasks)
        self.tasks.append(t)
        (self.cpu_tasks if res == "cpu" else self.queues[res]).append(t)
        return t

    def _gpu(self, kind: str, res: str, dur: float, deps: list, **kw: Any) -> _Task:
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
    def _deliver(self, u: int, s: int, free: _Task | None) -> _Task:
        d = self.d
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

    def _send(self, u: int, s: int, src: _Task, state: dict) -> None:
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

    def _device_reduce(self, u: int, s: int, src: _Task, state: dict, parity: bool = False) -> None:
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

    def _compute(self, kind_phase: str, dur: float, deps: list, u: int, s: int, state: dict) -> _Task:
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
        dedicated_ready: dict[int, _Task],
        s: int,
    ) -> _Task | None:
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
            ready: list[_Task | None] = [None] * len(schedule)
            done: list[_Task | None] = [None] * len(schedule)
            dedicated_ready: dict[int, _Task] = {}
            state["wait"] += list(state["gdone"])  # gE / gH reuse at the start of a step
            k = 0
            win = (schedule, plan, by_get, ready, done, dedicated_ready, s)

            def get(k: int, win: tuple = win) -> _Task | None:
                return self._get(k, *win)

            sent: dict[int, _Task] = {}  # an offloaded layer's activations on their way out
            fetched: dict[int, _Task] = {}  # ... and on their way back, fetched after their own copy out

            def fetch(u: int, after: _Task | None = None, sent: dict = sent, fetched: dict = fetched,
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
                    done[k] = self._compute("backward", d.layer_bwd[pol], deps, u, s, state)
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
                for u in (u for u in range(len(d.units)) if u not in self.on_device and u not in self.streamed):
                    f = _Task("final", "cpu", 0.0 if "final" in d.zero else d.update[u], norm, unit=u, step=s)
                    f.base = f.dur
                    f.loads = {"dram": d.update_bytes[u], **({"cores": f.dur} if d.cpu_mode else {})}
                    f.order = len(self.tasks)
                    self.tasks.append(f)
                    self.final[s].append(f)
                    self.updated[(s, u)] = f

    # ------------------------------------------------------------------ scheduling
    def run(self) -> None:
        """Place every task: in-order resources as soon as their head's dependencies are placed; the updater
        by its own rule at the time it becomes free. Each task counts its deps not yet placed (`waiting`), so
        that whether a head may go is one look, not a walk over its deps; a planning search replays hundreds of
        policies, each a few times."""
        for t in self.tasks:
            t.start = t.end = t.binding = None
            t.waiting = len(t.deps)
        self._heads = [0] * len(IN_ORDER)  # per in-order resource, in IN_ORDER: the next task to place
        self._last: list[_Task | None] = [None] * len(IN_ORDER)  # ... and the last placed
        self._cpu_last: _Task | None = None
        self._committed: tuple[_Task, _Task | None] | None = None  # the updater's next task, what it waits after
        self._forced: list[_Task] = []
        self._holds_done: dict[int, int] = {}
        # handed over and not started, in hand-over order: the host hands over in program order, so the handed
        # over are always the first `_handed` of cpu_tasks
        self._known: list[_Task] = []
        self._handed = 0
        self._left = len(self.tasks)
        while self._left:
            progress = self._drain()
            progress = self._updater(force=False) or progress
            if not progress and not self._updater(force=True):
                raise RuntimeError(
                    "the overlap model found no schedule: a dependency cycle in the replayed program"
                )

    def _drain(self) -> bool:
        """One pass over the in-order resources, each placing its queue's heads while their deps are placed."""
        progress = False
        heads, lasts = self._heads, self._last
        for i, q in enumerate(self._ends_blocked):
            head = heads[i]
            if q[head].waiting:
                continue
            last, t = lasts[i], q[head]
            while not t.waiting:  # the queue's end is a task that never becomes ready
                _place(t, last, t.deps)
                last, head = t, head + 1
                t = q[head]
            self._left -= head - heads[i]
            heads[i], lasts[i] = head, last
            progress = True
        return progress

    def _handed_over(self) -> list[_Task]:
        """The updater's tasks whose hand-over has been placed and that have not started, in hand-over order."""
        cpu, known = self.cpu_tasks, self._known
        while self._handed < len(cpu) and self.submitted_by[self._handed].end is not None:
            known.append(cpu[self._handed])
            self._handed += 1
        return known

    def _updater(self, force: bool) -> bool:
        """One decision or placement of the updater thread (slidedp.step.optimizer.Updater)."""
        cpu_free = self._cpu_last.end if self._cpu_last is not None else 0.0
        if self._committed is None:
            if self._forced:
                self._committed = (self._forced.pop(0), self._cpu_last)
            else:
                known = self._handed_over()
                if not known:
                    return False
                # the host hands over in program order on its in-order resource, so the hand-overs of `known`
                # end in order: the first handed over is the first in, and the first available, and the last
                # is the newest
                first_in = known[0]
                t0, why = cpu_free, self._cpu_last
                if self.submit[first_in.order].end > t0:  # idle until the next hand-over
                    t0, why = self.submit[first_in.order].end, self.submit[first_in.order]
                host = self._last[_HOST]
                host_done = self._heads[_HOST] == len(self.queues["host"])
                # Decide only once every hand-over up to t0 is known (the host runs in time order), unless
                # the host itself waits on this thread.
                if not (force or host_done or (host is not None and host.end >= t0)):
                    return False
                pick = first_in
                eb = self.end_backward.get(pick.step)
                ended = eb is not None and eb.end is not None and eb.end <= t0
                newest = self.seq[known[-1].order]
                if ended or self.seq[pick.order] > newest + 2 - self.d.staging_slots:
                    # the lowest unit among the gradients that have landed: after the backward so the next
                    # forward's first units come first, during it so that what is left at its end spreads up to
                    # the top layers; during it not when one of the next two handoffs would wait for the oldest
                    # one's staging slot. None landed: the first issued (copies out land in the order issued).
                    avail = [t for t in known if self.submit[t.order].end <= t0]
                    same = [t for t in avail if t.step == pick.step]
                    landed = [t for t in same if all(x.end is not None and x.end <= t0 for x in t.deps)]
                    pick = min(landed, key=lambda t: t.unit) if landed else min(same, key=lambda t: t.order)
                known.remove(pick)
                self._committed = (pick, why)
        t, why = self._committed
        if t.waiting:
            return False
        _place(t, why, t.deps)
        self._cpu_last = t
        self._committed = None
        self._left -= 1
        if t.kind == "hold":
            self._holds_done[t.step] = self._holds_done.get(t.step, 0) + 1
            if self._holds_done[t.step] == self.holds_per_step[t.step]:
                self._forced.extend(self.final[t.step])  # the norm is known: update in forward order
        return True


def _place(t: _Task, prev: _Task | None, deps: list[_Task]) -> None:
    start, binding = 0.0, None
    if prev is not None and prev.end > start:
        start, binding = prev.end, prev
    for x in deps:
        if x.end > start:
            start, binding = x.end, x
    t.start, t.end, t.binding = start, start + t.dur, binding
    for x in t.dependents:
        x.waiting -= 1


# ---------------------------------------------------------------------------- the replay's outcome
def replay(d: Durations, iterations: int = 3) -> Outcome:
    """Replay two steps, slowing shared-bandwidth work until the schedule settles; measure the second (every
    micro-batch of it: planning/long_step.py extends a long step from two short replays instead)."""
    rep = _Replay(d)
    capacity = capacities(d)
    rep.run()
    users = pool_users(rep.tasks, capacity)
    # only a task that loads a pool is ever slowed: every other keeps its base duration (the update below gives
    # base * 1.0 for it), so the updates walk the pools' users alone
    shared = sorted({t.order: t for pool in users.values() for t, _ in pool}.items())
    for _ in range(iterations if capacity else 0):
        factors = slowdowns(users, capacity)
        changed = 0.0
        for _, t in shared:
            f = factors.get(t.order, 1.0)
            new = t.base * (0.5 * f + 0.5 * (t.dur / t.base if t.base else 1.0))
            moved = abs(new - t.dur)
            if moved > changed:
                changed = moved
            t.dur = new
        rep.run()
        if changed < 2e-4:
            break
    return _measure(rep)


def _measure(rep: _Replay) -> Outcome:
    b0, b1 = rep.backward_last[0].end, rep.backward_last[1].end
    period = b1 - b0
    phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "update_tail": 0.0, "delivery_wait": 0.0}
    prev_end = b0
    for t in rep.queues["compute"]:
        if t.step != 1 or t.kind != "compute":
            continue
        if t.start > prev_end:
            _attribute(prev_end, t.start, t.binding, phases)
        phases[t.phase] += t.dur
        prev_end = t.end
    busy: dict[str, float] = {}
    for t in rep.tasks:
        lo, hi = max(t.start, b0), min(t.end, b1)
        if hi > lo and t.res != "host":
            busy[t.res] = busy.get(t.res, 0.0) + (hi - lo)
    # the engine's cut: its backward ends after the device update (engine._end_backward records backward_end again
    # once it is issued), so the step it cuts starts there too, not at the embedding's backward
    start = rep.device_updated[0].end if 0 in rep.device_updated else b0
    fwd = max(0.0, rep.forward_first[1].end - start)
    spans = {"forward": fwd, "backward": period - fwd}
    return Outcome(step_time_s=period, phases=phases, busy=busy, tasks=len(rep.tasks), spans=spans,
                   replayed=len(rep.tasks))


def _attribute(gap_start: float, gap_end: float, t: _Task | None, phases: dict[str, float]) -> None:
    """Split an idle gap of the compute stream by what it waited for, walking back the binding chain."""
    end = gap_end
    while t is not None and end > gap_start:
        seg = end - max(t.start, gap_start)
        if seg > 0:
            phases["update_tail" if t.kind in UPDATE_KINDS else "delivery_wait"] += seg
        end = min(end, t.start)
        t = t.binding
    if end > gap_start:
        phases["delivery_wait"] += end - gap_start
