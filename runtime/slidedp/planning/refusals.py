"""AutoPolicy's refusals: a job that cannot fit this host is refused with what does not fit, by how much, and
which setting to change (the planning issue's "an infeasible job is refused"). Imports no torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from slidedp.planning.job import (
    CAP_BUDGET_FRACTION,
    CONTEXT_BYTES,
    GIB,
    HBM_BUDGET_FRACTION,
    Job,
    smallest_cap_gib,
)
from slidedp.planning.memory_model import ALLOCATOR_SLACK
from slidedp.planning.plan import Plan
from slidedp.policy import ExecutionPolicy


class Infeasible(Exception):
    """Raised inside the planner with the structured errors the plan's refusal carries."""

    def __init__(self, errors: list[dict[str, str]]):
        super().__init__("; ".join(e["msg"] for e in errors))
        self.errors = errors

    def __reduce__(self) -> tuple[type, tuple[list[dict[str, str]]]]:
        """Pickled as its errors (a search in a forked copy, planning/forked.py, raises it in the parent)."""
        return Infeasible, (self.errors,)


class Refusals:
    """Mixed into the planner, which provides job, cfg, fixed (the settings the user fixed), base(), routes(),
    fits(), mem(), fixed_mix(), counts() and with_counts()."""

    job: Job
    cfg: Any
    fixed: dict[str, Any]
    smallest_cap: float | None = None

    def check_minimum(self, window: int, chunk: int, loss_chunks: list[int]) -> None:
        """Refuse a job whose leanest policy (or the user's fixed choices) fits on no route: a job that fits on
        one (the embedding and head updated on the GPU stage no head-sized gradient in host memory) is planned."""
        j, errors = self.job, []
        leans = [
            self.fewest_staging(self.base(
                "replicated" if j.world == 1 else delivery,
                grad,
                self.fixed.get("window", 2),
                chunk,
                min(loss_chunks),
                {},
                edge,
                min(self.fixed.get("device_layers") or 0, j.layers),
            ))
            for delivery, grad, edge in self.routes()
        ]
        cap_error = self.cap_over_card()
        if cap_error is not None:
            raise Infeasible([cap_error])
        if any(self.fits(pol) is None for pol in leans):
            return
        # described: the route that comes closest, so that what the refusal states (a shortfall of host RAM, the
        # smallest cap, the most layers that may keep) is what the job needs on its best route: the leanest in
        # GPU memory of those whose host state fits, else the leanest in host memory; but a first route short
        # of host RAM only by the bf16 copy the GPU cast drops is described as it is, naming the cast
        host_fits = [pol for pol in leans if self.mem(pol)["host_bytes"] <= j.host_limit_bytes]
        first = self.mem(leans[0])
        short = first["host_bytes"] - j.host_limit_bytes
        first_cast = j.precision == "bf16" and leans[0].delivery_cast == "host"
        if short > 0 and first_cast and first["host_parts"].get("delivery_copy", 0.0) >= short:
            lean = leans[0]
        elif host_fits:
            lean = min(host_fits, key=lambda pol: self.mem(pol)["hbm_peak_bytes"])
        else:
            lean = min(leans, key=lambda pol: self.mem(pol)["host_bytes"])
        m = self.mem(lean)
        if m["host_bytes"] > j.host_limit_bytes:
            parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in m["host_parts"].items() if v)
            short = (m["host_bytes"] - j.host_limit_bytes) / GIB
            loc = "host_ram_gib" if self.cfg.host_ram_gib is not None else "model"
            fix = "use a smaller model, fewer ranks, or a host with more RAM"
            for key in ("offload_layers", "activations", "window"):
                if key in self.fixed:
                    loc, fix = f"policy.{key}", f"lower policy.{key} (it holds host memory) or " + fix
                    break
            copy = m["host_parts"].get("delivery_copy", 0.0)
            # the cast of the policy priced: a bf16 copy in host RAM only where the host makes it
            host_cast = j.precision == "bf16" and lean.delivery_cast == "host"
            if host_cast and copy >= m["host_bytes"] - j.host_limit_bytes:
                loc = "policy.delivery_cast"
                fix = (f"set policy.delivery_cast to gpu (the GPUs make the bf16 weights from the fp32 master: no "
                       f"{copy / GIB:.1f} GiB bf16 copy in host memory), or " + fix)
            errors.append(
                {
                    "loc": loc,
                    "msg": f"host RAM too small: the job needs {m['host_bytes'] / GIB:.1f} GiB "
                    f"({parts} GiB), {short:.1f} GiB more than the {j.host_limit_bytes / GIB:.1f} GiB "
                    f"available ({j.host_limit_source}); {fix}",
                }
            )
        elif j.on_gpu:
            errors.append(self.hbm_error(lean, m))
        raise Infeasible(errors)

    def cap_over_card(self) -> dict[str, str] | None:
        """A gpu_memory_gib above what the job's GPUs have: refused, naming the card."""
        j = self.job
        if j.hbm_cap_bytes is None or not j.hbm_bytes or j.hbm_cap_bytes <= j.hbm_bytes:
            return None
        return {
            "loc": "gpu_memory_gib",
            "msg": f"{j.hbm_cap_bytes / GIB:g} GiB is more than the {j.hbm_bytes / GIB:.1f} GiB each of this job's "
            f"GPUs has; give at most {j.hbm_bytes / GIB:.1f}, or leave gpu_memory_gib unset for the whole card",
        }

    def budget_words(self) -> str:
        """How the HBM budget was cut: from the card, or from the job's gpu_memory_gib."""
        j = self.job
        if j.hbm_cap_bytes is not None and j.hbm_budget < int(j.hbm_bytes * HBM_BUDGET_FRACTION):
            return (
                f"{CAP_BUDGET_FRACTION:.0%} of the gpu_memory_gib cap of {j.hbm_cap_bytes / GIB:g} GiB less "
                f"{CONTEXT_BYTES / GIB:g} GiB for the CUDA context and NCCL"
            )
        return f"{HBM_BUDGET_FRACTION:.0%} of {j.hbm_bytes / GIB:.1f} GiB"

    def hbm_error(self, pol: ExecutionPolicy, m: dict[str, Any]) -> dict[str, str]:
        j = self.job
        over = (m["hbm_peak_bytes"] - j.hbm_budget) / GIB
        big = sorted(((v, k) for k, v in m["hbm_parts"].items()), reverse=True)[:3]
        parts = ", ".join(f"{k} {v * (1 + ALLOCATOR_SLACK) / GIB:.1f}" for v, k in big)
        head = (
            f"needs {m['hbm_peak_bytes'] / GIB:.1f} GiB of HBM per GPU ({parts} GiB, with allocator slack), "
            f"{over:.1f} GiB over the budget of {j.hbm_budget / GIB:.1f} GiB ({self.budget_words()})"
        )
        fixed = self.fixed_mix()
        if self.fixed.get("activations") == "keep":
            n = self.max_count(pol, "keep")
            return {
                "loc": "policy.activations",
                "msg": f"keeping every layer's activations {head}; set activations "
                f"to auto, or to auto with keep_layers at most {n}",
            }
        for key, field in (
            ("keep_layers", "keep"),
            ("resident_units", "resident"),
            ("offload_layers", "offload"),
        ):
            if key in self.fixed and fixed.get(field):
                n = self.max_count(pol, field)
                return {
                    "loc": f"policy.{key}",
                    "msg": f"{head}; set {key} to at most {n} (or leave it unset)",
                }
        if self.fixed.get("device_layers"):
            n = pol.device_layers
            while n > 0 and self.fits(dataclasses.replace(pol, device_layers=n - 1, resident=(False,) * j.layers)):
                n -= 1
            return {
                "loc": "policy.device_layers",
                "msg": f"{head} (the device state of {pol.device_layers} layers is "
                f"{self.mem(pol)['hbm_parts'].get('device_state', 0) / GIB:.1f} GiB of it); set device_layers to at "
                f"most {max(0, n - 1)}, or 0",
            }
        for key in ("window", "loss_chunk_tokens"):
            if key in self.fixed:
                return {"loc": f"policy.{key}", "msg": f"{head}; lower policy.{key}"}
        if j.hbm_cap_bytes is not None:
            smallest = smallest_cap_gib(m["hbm_peak_bytes"])
            self.smallest_cap = smallest  # the refusal's smallest_gpu_memory_gib (a way out, when the card has it)
            card = f"; the card has {j.hbm_bytes / GIB:.1f} GiB" if smallest * GIB <= j.hbm_bytes else (
                f", more than the card's {j.hbm_bytes / GIB:.1f} GiB: lower micro_batch_size or seq_len")
            return {
                "loc": "gpu_memory_gib",
                "msg": f"{j.hbm_cap_bytes / GIB:g} GiB is too small for this job: even with every layer "
                f"checkpointed it {head}. The smallest gpu_memory_gib that fits is {smallest:g} GiB{card}",
            }
        return {
            "loc": "micro_batch_size",
            "msg": f"even with every layer checkpointed the job {head}; lower "
            f"micro_batch_size or seq_len, or use more GPUs",
        }

    def max_count(self, pol: ExecutionPolicy, field: str) -> int:
        n = self.counts(pol)
        while n[field] > 0:
            n[field] -= 1
            if self.fits(self.with_counts(pol, n)) is None:
                break
        return n[field]


# Ways out of a refusal: each a change of the job, planned by the memory model alone (no times, so a check costs
# milliseconds), the first that fits of each kind listed. The work stays bounded: micro-batch halvings down to 1,
# seq_len halvings down to MIN_WAY_SEQ, one cap, GPU doublings up to what the host has (about 8 checks).
MIN_WAY_SEQ = 512


def ways_out(cfg: Any, plan: Plan, gpus_on_host: int, check: Callable[[Any], Plan]) -> list[dict[str, Any]]:
    """The cheapest changes that make a refused job fit, each `{"change", "fits", "hbm_peak_gib", "hbm_budget_gib",
    "host_ram_gib", "host_limit_gib", "summary"}`; `check(cfg)` plans a changed config by memory alone. Only a
    refusal for memory has ways out (a bad model name or GPU count is fixed by the setting its error names)."""
    if plan.feasible or plan.job is None or any(
        e["loc"] in ("model", "gpus") or "more than the" in e["msg"] and e["loc"] == "gpu_memory_gib"
        for e in plan.errors
    ):
        return []
    out = []
    if cfg.policy.delivery_cast == "host" and cfg.precision == "bf16" and cfg.gpus > 0:
        # the cast on the GPUs keeps no bf16 copy in host RAM and changes nothing the job trains on: listed first
        way = _try(check, cfg, {"policy": {"delivery_cast": "gpu"}},
                   "policy.delivery_cast gpu (the GPUs make the bf16 weights from the fp32 master)")
        if way:
            out.append(way)
    mb, ga, seq = cfg.micro_batch_size, cfg.grad_accum, cfg.seq_len
    sequences = mb * ga * cfg.world_size
    smaller, m = [], mb
    while m > 1:
        m = max(d for d in range(1, m // 2 + 1) if mb % d == 0)  # a divisor, so a step can keep its sequences
        smaller.append(m)
    way = None
    for m in smaller:  # first with grad_accum raised to keep the step's sequences
        way = _try(check, cfg, {"micro_batch_size": m, "grad_accum": ga * mb // m},
                   f"micro_batch_size {m} with grad_accum {ga * mb // m} (the same {sequences} sequences a step)")
        if way:
            break
    # more micro-batches a step can cost memory of their own (a gradient accumulated across them): then the
    # smaller micro-batch with grad_accum as it is, a step of fewer sequences
    for m in smaller if way is None else []:
        fewer = m * ga * cfg.world_size
        way = _try(check, cfg, {"micro_batch_size": m},
                   f"micro_batch_size {m} (a step then holds {fewer} sequence{'s' if fewer > 1 else ''}, not "
                   f"{sequences}; with grad_accum raised to keep them it does not fit)")
        if way:
            break
    if way:
        out.append(way)
    s = seq
    while s // 2 >= MIN_WAY_SEQ:
        s //= 2
        way = _try(check, cfg, {"seq_len": s}, f"seq_len {s} (each step then trains on {s / seq:.0%} of the tokens)")
        if way:
            out.append(way)
            break
    # The refusal's smallest cap is priced on the leanest policy at the refused cap; at a larger cap the start
    # knobs can take a little more, so the named cap may itself refuse: the next half GiB up is tried (so the cap
    # found is the smallest that fits on the 0.5 GiB grid caps are named on), then the cap that refusal names.
    cap = plan.smallest_gpu_memory_gib if cfg.gpu_memory_gib is not None else None
    for attempt in range(6):
        if cap is None:
            break
        refused: list[Plan] = []
        way = _try(check, cfg, {"gpu_memory_gib": cap}, f"gpu_memory_gib {cap:g} (from {cfg.gpu_memory_gib:g})",
                   refused)
        if way:
            out.append(way)
            break
        named = refused[0].smallest_gpu_memory_gib
        cap = None if named is None else (cap + 0.5 if attempt < 4 else max(named, cap + 0.5))
    n = cfg.gpus
    while 0 < n < gpus_on_host:
        n = min(2 * n, gpus_on_host)
        way = _try(check, cfg, {"gpus": n},
                   f"gpus {n} (from {cfg.gpus}; a step then holds {mb * ga * n} sequences, not {sequences})")
        if way:
            out.append(way)
            break
    return out


def _try(check: Callable[[Any], Plan], cfg: Any, change: dict[str, Any], words: str,
         refused: list[Plan] | None = None) -> dict | None:
    """The way out `change` names, when the changed job fits; None when it does not (its refusal then appended
    to `refused`). A section's keys are changed as a dict (`{"policy": {"delivery_cast": "gpu"}}`)."""
    fields = {k: dataclasses.replace(getattr(cfg, k), **v) if isinstance(v, dict) else v for k, v in change.items()}
    plan = check(dataclasses.replace(cfg, **fields))
    if not plan.feasible:
        if refused is not None:
            refused.append(plan)
        return None
    peak, budget = plan.predicted.hbm_peak_gib, plan.job.hbm_budget_gib
    host, limit = plan.predicted.host_ram_gib, plan.job.host_limit_gib
    if peak is not None and budget:
        fig = f"{peak:.1f} of {budget:.1f} GiB of GPU memory per GPU"
    else:
        fig = f"{host:.1f} of {limit:.1f} GiB of host RAM"
    return {"change": change, "fits": True, "hbm_peak_gib": peak, "hbm_budget_gib": budget, "host_ram_gib": host,
            "host_limit_gib": limit, "summary": f"{words}: {fig}"}
