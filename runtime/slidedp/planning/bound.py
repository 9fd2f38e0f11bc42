"""The step's physical bound (docs/architecture.md §4): what no overlap can beat, from the same calibrated
ceilings the overlap model uses. Imports no torch.

    b = bound(job, pol, Rates(calibration, job))   # {"step_time_s", "binding", "terms_s", "unhidden_s", ...}

The plan reports it beside the prediction (how much of the step is the pipeline's own exposure) and `slidedp bench`
beside the measurement (how close a run comes to what the hardware allows).
"""

from __future__ import annotations

from typing import Any

from slidedp.planning.cost_model import Rates, durations
from slidedp.planning.job import Job
from slidedp.policy import ExecutionPolicy
from slidedp.schedule import step_schedule, window_plan


def bound(job: Job, pol: ExecutionPolicy, rates: Rates) -> dict[str, Any]:
    """The bound of a step under this policy (docs/architecture.md §4), from the calibrated ceilings: the largest
    of GPU compute, the host update alone, H2D and D2H bytes over one GPU's link, and host DRAM bytes over its
    capacity, plus the one unit's update and delivery no ordering can hide. With exact clipping the updates wait
    for the whole backward: bwd + max(fwd, update) takes the place of the compute term. What the overlap model
    predicts on top of this is the pipeline's own exposure."""
    d = durations(job, pol, rates)
    L, M = job.layers, job.grad_accum
    head = L + 1
    fwd = M * (d.embed_fwd + sum(d.layer_fwd[a] for a in d.activations))
    bwd = M * (d.head + d.embed_bwd + sum(d.layer_bwd[a] for a in d.activations)) + sum(d.device_update)
    update = sum(d.update)  # with clipping, what runs after the norm is known
    hold = sum(d.hold) if job.clip else 0.0  # with clipping, the norm and the copy as gradients arrive
    # the deliveries the window makes in a step (a kept edge unit's bytes and time are zero)
    schedule = step_schedule(L, M)
    dedicated = {0, head} | {i + 1 for i, r in enumerate(pol.resident) if r}
    plan, _ = window_plan(schedule, dedicated, pol.window)
    delivered = [schedule[k] for k, e in enumerate(plan) if (e[1] if e[0] == "d" else e[2])]
    offload = pol.counts()["offload"] * M
    h2d = sum(d.deliver[u] for u in delivered) + offload * d.act_h2d
    d2h = sum(d.grad_d2h) + offload * d.act_d2h
    dma_bytes = job.world * (sum(d.deliver_bytes[u] for u in delivered) + sum(d.grad_bytes)
                             + 2 * offload * d.act_bytes)
    dram_bytes = sum(d.update_bytes) + (sum(d.hold_bytes) if job.clip else 0.0) + dma_bytes
    dram_cap, _ = rates.pools()
    terms = {
        # with exact clipping the updates run after the backward, under the next forward only
        "compute": bwd + max(fwd, update) if job.clip else fwd + bwd,
        "cpu_update": update + hold,
        "h2d": h2d,
        "d2h": d2h,
        "host_dram": dram_bytes / dram_cap if dram_cap else 0.0,
    }
    first = 1 if pol.edge_units_on_gpu else 0  # the next forward's first unit the host updates
    exposed = d.update[first] + d.deliver[first]
    binding = max(terms, key=terms.get)
    step = terms[binding] + exposed
    return {
        "step_time_s": step,
        "tokens_per_s": job.tokens_per_step / step if step > 0 else None,
        "binding": binding,
        "terms_s": terms,
        "unhidden_s": exposed,
        "host_dram_bytes": dram_bytes,
    }
