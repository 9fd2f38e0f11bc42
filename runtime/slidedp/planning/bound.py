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
from slidedp.planning.long_step import steady_samples
from slidedp.planning.overlap import Durations
from slidedp.policy import ExecutionPolicy
from slidedp.schedule import step_schedule, window_plan


def bound(job: Job, pol: ExecutionPolicy, rates: Rates) -> dict[str, Any]:
    """The bound of a step under this policy (docs/architecture.md §4), from the calibrated ceilings: the largest
    of GPU compute, the host update alone, H2D and D2H bytes over one GPU's link, and host DRAM bytes over its
    capacity, each with what its own dependencies leave exposed: GPU compute waits for the first host-updated
    unit's gradient, update and delivery beyond the GPU work below it; the host update idles from a step's last
    update until the next step's first gradient (the top host unit's forward, the loss head, its backward and
    copy out). With exact clipping the updates wait for the whole backward: bwd + max(fwd, update) takes the
    place of the compute term, and the forward from the first host-updated unit on waits for its update. What the
    overlap model predicts on top of this is the pipeline's own exposure."""
    d = durations(job, pol, rates)
    L, M = job.layers, job.grad_accum
    head = L + 1
    fwd = M * (d.embed_fwd + sum(d.layer_fwd[a] for a in d.activations))
    device = sum(d.device_update)  # after the backward, on the compute stream
    bwd = M * (d.head + d.embed_bwd + sum(d.layer_bwd[a] for a in d.activations)) + device
    update = sum(d.update)  # with clipping, what runs after the norm is known (in two passes, the weights pass)
    hold = sum(d.hold) if job.clip else 0.0  # with clipping, the copy (host route: and the sum) as gradients land
    # with clipping in two passes (policy.post_norm_passes), the moments pass: after the weights, off the forward's
    # path, but the host's work all the same
    moments = sum(d.moments) if job.clip else 0.0
    # the deliveries the window makes in a step (a kept edge unit's bytes and time are zero)
    dedicated = {0, head} | {i + 1 for i, r in enumerate(pol.resident) if r}
    delivered = _deliveries(L, M, dedicated, pol.window)
    offload = pol.counts()["offload"] * M
    h2d = sum(d.deliver[u] * n for u, n in delivered) + offload * d.act_h2d
    d2h = sum(d.grad_d2h) + offload * d.act_d2h
    dma_bytes = job.world * (sum(d.deliver_bytes[u] * n for u, n in delivered) + sum(d.grad_bytes)
                             + 2 * offload * d.act_bytes)
    dram_bytes = sum(d.update_bytes) + (sum(d.hold_bytes) + sum(d.moments_bytes) if job.clip else 0.0) + dma_bytes
    dram_cap, _ = rates.pools()
    terms = {
        # with exact clipping the host updates run after the backward (beside the device updates that follow it),
        # under the next forward only
        "compute": bwd - device + max(device + fwd, update) if job.clip else fwd + bwd,
        "cpu_update": update + hold + moments,
        "h2d": h2d,
        "d2h": d2h,
        "host_dram": dram_bytes / dram_cap if dram_cap else 0.0,
    }
    host = [u for u in range(len(d.units)) if d.update[u] > 0 or d.hold[u] > 0]
    exposed = {k: 0.0 for k in terms}
    if host:
        # compute: the first unit the host updates is updated after its gradient is back and delivered again
        # before its forward; only the GPU work of the units below it (their backward, then their forward)
        # can run meanwhile
        f = host[0]
        below = sum(d.layer_fwd[d.activations[u - 1]] + d.layer_bwd[d.activations[u - 1]] for u in range(1, f))
        below = M * (below + (d.embed_fwd + d.embed_bwd if f > 0 else 0.0))
        if job.clip:
            # the updates start once the norm is known, one after another in forward order. The first
            # micro-batch's forward of the units below the first host-updated one runs meanwhile (they need no
            # update); from that unit on it waits for its update and delivery; from the last host-updated unit on,
            # for every update of the step
            t = host[-1]
            after_first = d.update[f] + d.deliver[f] + fwd - _forward_below(d, f)
            after_last = update + d.deliver[t] + fwd - _forward_below(d, t)
            exposed["compute"] = max(0.0, max(after_first, after_last) - max(device + fwd, update))
        else:
            exposed["compute"] = max(0.0, d.grad_d2h[f] + d.update[f] + d.deliver[f] - below)
        # the host update: between a step's last update and the next step's first gradient the updater has
        # nothing to do. The last update precedes the forward of the top unit the host updates at the latest;
        # after that come its forward (delivered again unless resident), the loss head, its backward and its
        # gradient's copy out.
        t = host[-1]
        if t == L + 1:  # the head itself
            own = 0.0
        elif t == 0:  # only the embedding (tied, every layer on the GPUs)
            own = d.embed_fwd + d.embed_bwd
        else:
            own = d.layer_fwd[d.activations[t - 1]] + d.layer_bwd[d.activations[t - 1]]
        gap = d.deliver[t] + own + d.head + d.grad_d2h[t]
        exposed["cpu_update"] = gap
    binding = max(terms, key=lambda k: terms[k] + exposed[k])
    step = terms[binding] + exposed[binding]
    return {
        "step_time_s": step,
        "tokens_per_s": job.tokens_per_step / step if step > 0 else None,
        "binding": binding,
        "terms_s": terms,
        "unhidden_s": exposed[binding],
        "host_dram_bytes": dram_bytes,
    }


def _forward_below(d: Durations, unit: int) -> float:
    """One micro-batch's forward of the units below `unit` (the embedding, then layers 1..unit-1; the loss head is
    the backward's, as the engine measures it)."""
    if unit <= 0:
        return 0.0
    layers = min(unit - 1, len(d.activations))
    return d.embed_fwd + sum(d.layer_fwd[d.activations[u]] for u in range(layers))


def _deliveries(layers: int, micro_batches: int, dedicated: set[int], window: int) -> list[tuple[int, int]]:
    """(unit, deliveries) pairs that sum to what the window delivers in a step: (unit, 1) per delivery in
    schedule order, or for a step too long to walk each unit's count extended from two shorter steps, as the
    overlap model extends its replay (long_step.steady_samples): past the first micro-batch the window repeats
    its deliveries every two micro-batches at most."""
    def walk(m: int) -> list[tuple[int, int]]:
        schedule = step_schedule(layers, m)
        plan, _ = window_plan(schedule, dedicated, window)
        return [(schedule[k], 1) for k, e in enumerate(plan) if (e[1] if e[0] == "d" else e[2])]

    samples = steady_samples(micro_batches)
    if samples is None:
        return walk(micro_batches)
    a, b, n = samples
    short, longer = {}, {}
    for counts, m in ((short, a), (longer, b)):
        for u, _ in walk(m):
            counts[u] = counts.get(u, 0) + 1
    return [(u, short.get(u, 0) + n * (longer.get(u, 0) - short.get(u, 0))) for u in sorted({*short, *longer})]
