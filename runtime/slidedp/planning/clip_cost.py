"""What exact clipping costs the chosen plan, and where its update runs: the plan's `clipping` (planning/plan.py
Clipping, docs/interfaces.md §5).

With max_grad_norm > 0 no update starts before the whole gradient's norm is known, so the chosen policy's step is
compared with the same policy priced for the same job without clipping, by the same planner (its memory and cost
model, on a job that differs only in `clip`). The one change made for that pricing: streamed layers are updated on
the host again (`unclipped_change` {"streamed_layers": 0}), as streaming through the GPUs after the norm exists for
clipping only (planning/streamed.py; AutoPolicy never streams an unclipped job). It is one more pricing of one
policy, not a second search: the unclipped search could choose another policy (another cast, other device layers),
so `unclipped_step_time_s` is what clipping costs this plan, not what the best unclipped plan would take.

The split says who updates what (parameters counted unpadded): the host CPU the layers above the device layers and
the streamed ones (and the embedding and head with edge_update host), the GPUs the `device_layers` and, with
edge_update gpu, the embedding and head, and the `streamed_layers` after the device layers streamed through the GPUs
after the norm.
Where the gradients wait: in host memory, the held gradient of the units the host updates (slidedp.step.layout;
bf16 where exact, held_in_bf16); on each GPU, the streamed layers' (the memory model's `streamed_gradients`, before
the allocator's slack). A device-updated unit's gradient waits in its device state (`device_state`).

Imports no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slidedp.planning.cost_model import GIB, Rates
from slidedp.planning.memory_model import gpu_parts
from slidedp.planning.plan import Clipping, Prediction
from slidedp.policy import ExecutionPolicy
from slidedp.step.layout import held_in_bf16, plan_layout


def unclipped_policy(pol: ExecutionPolicy) -> tuple[ExecutionPolicy, dict[str, Any]]:
    """The chosen policy as the same job runs it without clipping, and what was changed for that."""
    if pol.streamed_layers:
        return dataclasses.replace(pol, streamed_layers=0), {"streamed_layers": 0}
    return pol, {}


def clipping_cost(planner: Any, pol: ExecutionPolicy, pred: Prediction) -> Clipping | None:
    """The plan's `clipping` for the chosen `pol` and its prediction `pred`; None for a job without clipping.
    `planner` is the plan's planner (autopolicy._Planner: cfg, job, rates, acts, fits(), time())."""
    job, cfg = planner.job, planner.cfg
    if not job.clip:
        return None
    step = pred.step_time_s
    other, change = unclipped_policy(pol)
    unclipped, fits = None, None
    if planner.rates is not None:
        # the same planner on the same job, max_grad_norm 0: one pricing of one policy
        cfg0 = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, max_grad_norm=0.0))
        job0 = dataclasses.replace(job, clip=False)
        plain = type(planner)(cfg0, job0, Rates(planner.rates.c, job0), planner.acts)
        unclipped, fits = plain.time(other), plain.fits(other) is None
    cost = step - unclipped if step is not None and unclipped is not None else None
    L, N = job.layers, job.world
    on_device, streamed = pol.device_units(L), pol.streamed_units()
    host_units = [u for u in range(len(job.units)) if u not in on_device and u not in streamed]
    held = plan_layout(list(job.units), N, pol, job.precision, True, directory="",
                       grad_accum=job.grad_accum).held_numels()
    waiting = gpu_parts(job, pol, planner.acts).get("streamed_gradients", 0.0) if job.on_gpu else 0.0
    bf16 = set(held_in_bf16(N, job.precision, job.grad_accum, L))
    return Clipping(
        max_grad_norm=float(cfg.optimizer.max_grad_norm),
        step_time_s=step,
        unclipped_step_time_s=unclipped,
        cost_s=cost,
        cost_fraction=cost / unclipped if cost is not None and unclipped else None,
        unclipped_change=change,
        unclipped_fits=fits,
        layers=L,
        host_layers=sum(1 for u in host_units if 1 <= u <= L),
        device_layers=pol.device_layers,
        streamed_layers=len(streamed),
        edge_update=pol.edge_update,
        host_params=sum(job.units[u] for u in host_units),
        device_params=sum(job.units[u] for u in on_device),
        streamed_params=sum(job.units[u] for u in streamed),
        held_gradient_gib=(held["held"] * 4 + held["held16"] * 2) / GIB,
        held_bf16_gib=held["held16"] * 2 / GIB,
        gpu_waiting_gib=waiting / GIB,
        gpu_waiting_bf16=bool(streamed) and streamed <= bf16,
        post_norm_passes=pol.post_norm_passes,
    )


def clipping_words(c: Clipping) -> str:
    """The section in one sentence (`slidedp plan`; the preview says the same in its own words)."""
    if c.cost_s is not None and c.unclipped_step_time_s:
        cost = (f"costs {c.cost_s:+.3f} s ({c.cost_fraction:+.0%}) a step: {c.step_time_s:.3f} s against "
                f"{c.unclipped_step_time_s:.3f} s for this policy unclipped")
        if c.unclipped_change:
            cost += " with " + ", ".join(f"{k} {v}" for k, v in c.unclipped_change.items())
    else:
        cost = "is not timed (no calibration)"
    update = f"the host updates {c.host_layers} of {c.layers} layers"
    if c.edge_update != "gpu":
        update += " and the embedding and head"
    if c.post_norm_passes == 2 and (c.host_layers or c.edge_update != "gpu"):
        update += " (their new weights first, their moments after the next forward has them)"
    gpu = [f"{c.device_layers} layer{'s' if c.device_layers != 1 else ''}"] if c.device_layers else []
    if c.edge_update == "gpu":
        gpu.append("the embedding and head")
    if gpu:
        update += ", the GPUs " + " and ".join(gpu)
    if c.streamed_layers:
        update += f", {c.streamed_layers} stream through the GPUs after the norm"
    if c.held_gradient_gib <= 0:
        host = "none in host memory"
    elif c.held_bf16_gib >= c.held_gradient_gib:
        host = f"{_gib(c.held_gradient_gib)} in host memory (bf16)"
    elif c.held_bf16_gib > 0:
        host = f"{_gib(c.held_gradient_gib)} in host memory ({_gib(c.held_bf16_gib)} of it bf16)"
    else:
        host = f"{_gib(c.held_gradient_gib)} in host memory (fp32)"
    wait = host
    if c.gpu_waiting_gib > 0:
        wait += f", {_gib(c.gpu_waiting_gib)} on each GPU ({'bf16' if c.gpu_waiting_bf16 else 'fp32'})"
    return f"Clipping at {c.max_grad_norm} {cost}; {update}; gradients wait: {wait}."


def _gib(x: float) -> str:
    return f"{x:.1f} GiB" if x >= 0.1 else f"{x * 1024:.1f} MiB"
