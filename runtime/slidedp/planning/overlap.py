"""The overlap model of the pipeline: a discrete-event replay of two training steps of one rank.

Imports no torch. The engine's program (slidedp/step: engine, window, routes, optimizer; built as tasks by
planning/program.py) is replayed with durations from calibration instead of real work, on the resources that run
concurrently:

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
with the slowed durations until it settles (`replay`). In CPU
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

import numpy as np

from slidedp.planning.pools import capacities, pool_users, slowdowns
from slidedp.planning.program import IN_ORDER, Durations, Program, Task

_HOST = IN_ORDER.index("host")
UPDATE_KINDS = frozenset({"update", "hold", "post_norm_start", "final", "moments", "streamed"})  # host-update work: waits on it are `update_tail`
# Groups of task kinds that can be made free to measure a resource's exposure.
EXPOSURE_KINDS = {
    "h2d": frozenset({"deliver", "fetch"}),
    "d2h": frozenset({"grad_out", "act_out"}),
    "collective": frozenset({"all_gather", "reduce_scatter"}),
    "cpu_update": UPDATE_KINDS,
}


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


_NEVER_READY = Task("end", "host", 0.0, [])
_NEVER_READY.waiting = 1  # no task counts it among its deps, so it never becomes ready


# ---------------------------------------------------------------------------- placing the program
class _Replay(Program):
    """The program placed on its resources: run() gives every task its start and end, and the task that
    bound its start."""

    def __init__(self, d: Durations):
        super().__init__(d)
        # the in-order queues in IN_ORDER, each ended by a task that is never ready, so that a drain needs no
        # bounds check
        self._ends_blocked = [[*self.queues[r], _NEVER_READY] for r in IN_ORDER]

    def run(self) -> None:
        """Place every task: in-order resources as soon as their head's dependencies are placed; the updater
        by its own rule at the time it becomes free. Each task counts its deps not yet placed (`waiting`), so
        that whether a head may go is one look, not a walk over its deps; a planning search replays hundreds of
        policies, each a few times."""
        for t in self.tasks:
            t.start = t.end = t.binding = None
            t.waiting = len(t.deps)
        self._heads = [0] * len(IN_ORDER)  # per in-order resource, in IN_ORDER: the next task to place
        self._last: list[Task | None] = [None] * len(IN_ORDER)  # ... and the last placed
        self._cpu_last: Task | None = None
        self._committed: tuple[Task, Task | None] | None = None  # the updater's next task, what it waits after
        self._forced: list[Task] = []
        self._holds_done: dict[int, int] = {}
        # handed over and not started, in hand-over order: the host hands over in program order, so the handed
        # over are always the first `_handed` of cpu_tasks
        self._known: list[Task] = []
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

    def _handed_over(self) -> list[Task]:
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


def _place(t: Task, prev: Task | None, deps: list[Task]) -> None:
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
SHARING_ROUNDS = 16  # at most this many replays after the first; the shapes planned settle in 2-9
SETTLED = 1e-2  # a round that moved no shared task by more than this fraction of its base duration settles it


def replay(d: Durations, iterations: int = SHARING_ROUNDS) -> Outcome:
    """Replay two steps, slowing shared-bandwidth work until the schedule settles; measure the second (every
    micro-batch of it: planning/long_step.py extends a long step from two short replays instead).

    Each round sets every task that loads a pool to its base duration times its slowdown over the last replay
    (pools.slowdowns) and replays. A task slowed that way can overlap more of the others, so the rounds repeat
    until no task moves by SETTLED of its base duration: the durations are then the sharing the schedule they
    produce implies. A round that moves the tasks no less than the round before (overlaps that appear and vanish
    in turn) halves the steps from then on, which makes them settle."""
    rep = _Replay(d)
    capacity = capacities(d)
    rep.run()
    users = pool_users(rep.tasks, capacity)
    casts = [t for t in rep.tasks if t.kind == "deliver" and t.loads.get("h2d") and t.base > 0] \
        if d.cast_beside_compute > 1.0 else []
    # only a task that loads a pool (or casts beside the compute) is ever slowed: every other keeps its base
    # duration, so the rounds walk those alone
    shared = sorted({**{t.order: t for t in casts},
                     **{t.order: t for pool in users.values() for t, _ in pool}}.items())
    step, moved_before = 1.0, None
    for _ in range(iterations if capacity or casts else 0):
        factors = slowdowns(users, capacity, d.dram_update_weight, d.copies_beside_update) if capacity else {}
        if casts:
            _beside_compute(casts, rep.queues["compute"], d.cast_beside_compute, factors)
        moved = 0.0
        for _, t in shared:
            new = t.dur + step * (t.base * factors.get(t.order, 1.0) - t.dur)
            moved = max(moved, abs(new - t.dur) / t.base)
            t.dur = new
        rep.run()
        if moved < SETTLED:
            break
        if moved_before is not None and moved >= moved_before:
            step = 0.5
        moved_before = moved
    return _measure(rep)


def _beside_compute(casts: list[Task], compute: list[Task], k: float, factors: dict[int, float]) -> None:
    """Slow each delivery that casts on the GPU by 1 + (k - 1) x the share of it the compute stream was busy
    (k: how much longer such a delivery took beside a running layer than alone), on top of its pools' factor."""
    if not compute:
        return
    starts = np.array([t.start for t in compute])
    ends = np.array([t.end for t in compute])
    busy_before = np.concatenate(([0.0], np.cumsum(ends - starts)))  # compute's busy seconds before task i

    def busy_until(x: np.ndarray) -> np.ndarray:  # compute's busy seconds from 0 to each x (in-order: no overlap)
        i = np.searchsorted(ends, x, side="right")  # tasks ended by x
        part = np.clip(x - starts[np.minimum(i, len(starts) - 1)], 0.0, None) * (i < len(starts))
        return busy_before[i] + part

    a = np.array([t.start for t in casts])
    b = np.array([t.end for t in casts])
    span = np.maximum(b - a, 1e-12)
    share = np.clip((busy_until(b) - busy_until(a)) / span, 0.0, 1.0)
    for t, f in zip(casts, share.tolist()):
        if f > 0:
            factors[t.order] = factors.get(t.order, 1.0) * (1.0 + (k - 1.0) * f)


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


def _attribute(gap_start: float, gap_end: float, t: Task | None, phases: dict[str, float]) -> None:
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
