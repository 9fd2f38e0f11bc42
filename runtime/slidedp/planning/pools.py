"""Shared bandwidth in the overlap model (planning/overlap.py): the pools a replay's tasks load and how much each
task slows down while others load the same pool.

A pool is host DRAM (the CPU update, host summation, every rank's PCIe copies), one GPU's PCIe link both ways at
once, each direction of that link alone, and in CPU training the rank's cores. A task's demand on a pool is its
rate when alone (bytes / base seconds); while the total demand exceeds the pool's capacity every task in it runs
slower by demand / capacity (proportional sharing). Tasks are the replay's (`loads`, `base`, `start`, `end`,
`order`); durations its Durations. Imports no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pool_users(tasks: list[Any], capacity: dict[str, float]) -> dict[str, list[tuple[Any, float]]]:
    """Per pool, the tasks that load it and their demand when alone (bytes / base seconds), in task order: the
    same in every pass of a replay, as loads and base durations do not change."""
    return {pool: [(t, t.loads[pool] / t.base) for t in tasks if t.loads.get(pool) and t.base > 0]
            for pool in capacity}


def slowdowns(users: dict[str, list[tuple[Any, float]]], capacity: dict[str, float]) -> dict[int, float]:
    """Per task, how much slower it runs than alone: total demand on its pools while it runs / capacity.

    Demands are each task's rate when alone (bytes / base seconds); sharing is proportional to them. `users`:
    pool_users of the replay.
    """
    factors: dict[int, float] = {}
    for pool, cap in capacity.items():
        running = [(t, rate) for t, rate in users[pool] if t.end > t.start]
        if not running:
            continue
        # piecewise-constant total demand, integrated with a sweep over every task's start and end: the edges at
        # one time merged (in task order), the demand's level and its integral summed edge by edge in time order
        n = len(running)
        edges = np.empty(2 * n)
        edges[0::2] = [t.start for t, _ in running]
        edges[1::2] = [t.end for t, _ in running]
        steps = np.empty(2 * n)
        steps[0::2] = [r for _, r in running]
        steps[1::2] = -steps[0::2]
        times, at = np.unique(edges, return_inverse=True)
        level = np.cumsum(np.bincount(at, weights=steps, minlength=len(times)))
        cum = np.zeros(len(times))
        np.cumsum(level[:-1] * np.diff(times), out=cum[1:])
        f = (cum[at[1::2]] - cum[at[0::2]]) / (edges[1::2] - edges[0::2]) / cap
        for i in np.flatnonzero(f > 1.0).tolist():
            order_i = running[i][0].order
            if f[i] > factors.get(order_i, 1.0):
                factors[order_i] = float(f[i])
    return factors


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
