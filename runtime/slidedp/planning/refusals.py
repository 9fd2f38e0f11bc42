"""AutoPolicy's refusals: a job that cannot fit this host is refused with what does not fit, by how much, and
which setting to change (the planning issue's "an infeasible job is refused"). Imports no torch."""

from __future__ import annotations

import dataclasses
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
from slidedp.policy import ExecutionPolicy


class Infeasible(Exception):
    """Raised inside the planner with the structured errors the plan's refusal carries."""

    def __init__(self, errors: list[dict[str, str]]):
        super().__init__("; ".join(e["msg"] for e in errors))
        self.errors = errors


class Refusals:
    """Mixed into the planner, which provides job, cfg, user (the settings the user fixed), base(), routes(),
    fits(), mem(), fixed_mix(), counts() and with_counts()."""

    job: Job
    cfg: Any
    user: dict[str, Any]

    def check_minimum(self, window: int, chunk: int, loss_chunks: list[int]) -> None:
        """Refuse a job whose leanest policy (or the user's fixed choices) cannot fit."""
        j, errors = self.job, []
        lean = self.base(
            "replicated" if j.world == 1 else self.routes()[0][0],
            self.routes()[0][1],
            self.user.get("window", 2),
            chunk,
            min(loss_chunks),
            {},
            self.routes()[0][2],
            min(self.cfg.policy.device_layers or 0, j.layers),
        )
        cap_error = self.cap_over_card()
        if cap_error is not None:
            raise Infeasible([cap_error])
        why = self.fits(lean)
        if why is None:
            return
        m = self.mem(lean)
        if m["host_bytes"] > j.host_limit_bytes:
            parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in m["host_parts"].items() if v)
            short = (m["host_bytes"] - j.host_limit_bytes) / GIB
            loc = "host_ram_gib" if self.cfg.host_ram_gib is not None else "model"
            fix = "use a smaller model, fewer ranks, or a host with more RAM"
            for key in ("offload_layers", "activations", "window"):
                if key in self.user:
                    loc, fix = f"policy.{key}", f"lower policy.{key} (it holds host memory) or " + fix
                    break
            copy = m["host_parts"].get("delivery_copy", 0.0)
            if j.host_cast and copy >= m["host_bytes"] - j.host_limit_bytes:
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
        if "activations" in self.user and self.user["activations"] == "keep":
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
            if key in self.user and fixed.get(field):
                n = self.max_count(pol, field)
                return {
                    "loc": f"policy.{key}",
                    "msg": f"{head}; set {key} to at most {n} (or leave it unset)",
                }
        if self.user.get("device_layers"):
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
            if key in self.user:
                return {"loc": f"policy.{key}", "msg": f"{head}; lower policy.{key}"}
        if j.hbm_cap_bytes is not None:
            smallest = smallest_cap_gib(m["hbm_peak_bytes"])
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
