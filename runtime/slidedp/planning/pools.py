"""Shared bandwidth in the overlap model (planning/overlap.py): the pools a replay's tasks load and how much each
task slows down while others load the same pool.

A pool is host DRAM (the CPU update, host summation, every rank's PCIe copies), one GPU's PCIe link both ways at
once, each direction of that link alone, and in CPU training the rank's cores. A task's demand on a pool is its
rate when alone (bytes / base seconds); while the total demand on a link or the cores exceeds its capacity every
task on it runs slower by demand / capacity (proportional sharing). A copy reaches host memory at the rate its links
leave it, and host memory is shared by weight: the host update's share per byte of demand against a copy's is what
calibration measured when the two ran together (copies lose more of their rate than the update does, by 0.7-1.45x
over the calibrations kept), so a copy slowed on its link is slowed again there. While the host update runs, the
copies together move at most what calibration measured them at beside it (_beside_update). Tasks are the replay's (`loads`,
`base`, `start`, `end`, `order`, `res`); durations its Durations. Imports no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pool_users(tasks: list[Any], capacity: dict[str, float]) -> dict[str, list[tuple[Any, float]]]:
    """Per pool, the tasks that load it and their demand when alone (bytes / base seconds), in task order: the
    same in every pass of a replay, as loads and base durations do not change."""
    return {pool: [(t, t.loads[pool] / t.base) for t in tasks if t.loads.get(pool) and t.base > 0]
            for pool in capacity}


LINK_POOLS = ("pcie", "h2d", "d2h")


def _levels(running: list[tuple[Any, float]]):
    """The sweep over the running tasks' starts and ends: (the distinct times, each edge's index in them, the edges
    (start, end per task, in task order), each edge's change of demand, the total demand from each time to the
    next)."""
    n = len(running)
    edges = np.empty(2 * n)
    edges[0::2] = [t.start for t, _ in running]
    edges[1::2] = [t.end for t, _ in running]
    steps = np.empty(2 * n)
    steps[0::2] = [r for _, r in running]
    steps[1::2] = -steps[0::2]
    times, at = np.unique(edges, return_inverse=True)
    level = np.cumsum(np.bincount(at, weights=steps, minlength=len(times)))
    return times, at, edges, steps, level


def _average(times, at, edges, per_time) -> np.ndarray:
    """Each task's average of a piecewise-constant function of time (per_time[k] from times[k] to times[k+1])."""
    cum = np.zeros(len(times))
    np.cumsum(per_time[:-1] * np.diff(times), out=cum[1:])
    return (cum[at[1::2]] - cum[at[0::2]]) / (edges[1::2] - edges[0::2])


def slowdowns(users: dict[str, list[tuple[Any, float]]], capacity: dict[str, float],
              update_weight: float = 1.0, copies_beside_update: float | None = None) -> dict[int, float]:
    """Per task, how much slower it runs than alone.

    On a GPU link (both ways, each direction): the total demand on it while the task runs / its capacity,
    demands being each task's rate when alone (proportional sharing); a task on several links takes the largest.
    In host memory a copy's demand is its rate on the links (alone, over that factor), and host memory slows it
    again: while the demand exceeds the capacity each task gets a share of the capacity in proportion to its demand
    times its weight, the host update's weight being `update_weight` (calibration's own pair of the update beside
    copies, cost_model.Rates.dram_update_weight) and every other task's 1. A copy's factor is its link's times
    host memory's. The rank's cores (CPU training): proportional. `users`: pool_users of the replay."""
    factors: dict[int, float] = {}
    link: dict[int, float] = {}
    for pool, cap in capacity.items():
        if pool == "dram":
            continue
        running = [(t, rate) for t, rate in users[pool] if t.end > t.start]
        if not running:
            continue
        times, at, edges, _, level = _levels(running)
        f = _average(times, at, edges, level) / cap
        for i in np.flatnonzero(f > 1.0).tolist():
            order_i = running[i][0].order
            if f[i] > factors.get(order_i, 1.0):
                factors[order_i] = float(f[i])
                if pool in LINK_POOLS:
                    link[order_i] = float(f[i])
    if "dram" in capacity:
        cap = capacity["dram"]
        running = [(t, rate / link.get(t.order, 1.0)) for t, rate in users["dram"] if t.end > t.start]
        if running:
            times, at, edges, steps, level = _levels(running)
            weights = np.array([update_weight if t.res == "cpu" else 1.0 for t, _ in running])
            wsteps = steps * np.repeat(weights, 2)
            wlevel = np.cumsum(np.bincount(at, weights=wsteps, minlength=len(times)))
            over = level > cap
            safe = np.where(level > 0, level, 1.0)
            out = np.empty(len(running))
            for w in set(weights.tolist()):
                share = np.where(over, wlevel / (w * safe), 1.0)  # 1 throughout where every weight is 1
                g = _average(times, at, edges, level / cap * share)
                mine = weights == w
                out[mine] = g[mine]
            for i in np.flatnonzero(out > 1.0).tolist():
                order_i = running[i][0].order
                total = link.get(order_i, 1.0) * float(out[i])
                if total > factors.get(order_i, 1.0):
                    factors[order_i] = total
        if copies_beside_update and running:
            _beside_update(running, copies_beside_update, factors)
    return factors


def _beside_update(running: list[tuple[Any, float]], rate: float, factors: dict[int, float]) -> None:
    """Copies beside the host update: while an update runs, the copies together move at most `rate` bytes/s, the
    rate calibration measured them at beside it (`host_dram.dma_with_update_GBps`, every GPU copying both ways).
    The weighted sharing above gives a copy only what host memory's capacity leaves it, and in a step the update
    leaves less than that: its demand there is its in-step rate, below the probe's, while the copies moved at the
    probe's rate beside it (a clipped step's streamed layers: the step timelines of docs/notebook/
    prediction-check-2026-12-08.md). A copy's factor is at least its average over its run of the copies' demand /
    `rate` where an update runs (1 elsewhere, and where the demand is below `rate`); the updater's other host-memory
    work (a clipped step's gradient holds) counts as an update. `running`: host memory's users at their demand
    reaching it."""
    copies = [(t, r) for t, r in running if t.res != "cpu"]
    updates = [(t, 0.0) for t, _ in running if t.res == "cpu"]
    if not copies or not updates:
        return
    times, at, edges, steps, level = _levels(copies + updates)
    nc = len(copies)
    # how many updates run from each time to the next: the updates' edges only, +1 at a start, -1 at an end
    ups = np.zeros(len(steps))
    ups[2 * nc::2], ups[2 * nc + 1::2] = 1.0, -1.0
    running_updates = np.cumsum(np.bincount(at, weights=ups, minlength=len(times)))
    per_time = np.where(running_updates > 0.5, np.maximum(level / rate, 1.0), 1.0)
    f = _average(times, at[:2 * nc], edges[:2 * nc], per_time)
    for i in np.flatnonzero(f > 1.0).tolist():
        order_i = copies[i][0].order
        if f[i] > factors.get(order_i, 1.0):
            factors[order_i] = float(f[i])


def capacities(d: Any) -> dict[str, float]:
    """The shared pools of a replay and their capacities: host DRAM and the GPU link in bytes/s (the link both
    ways at once, and each direction alone: a copy in and a copy out run side by side, two copies in share one
    direction), the rank's cores in CPU training."""
    capacity = {k: v for k, v in (("dram", d.dram_capacity), ("pcie", d.pcie_capacity), ("h2d", d.h2d_capacity),
                                  ("d2h", d.d2h_capacity)) if v}
    if "host_dram" in d.zero:
        capacity = {}
    if d.cpu_mode:  # the rank's compute and its updater share the rank's cores
        capacity["cores"] = 1.0
    return capacity
