"""Run health: tells a diverged or dead run from a good one, step by step, from the metrics records.

A non-finite loss or gradient norm is divergence: the job ends as failed with the reason (`diverged: loss is NaN
at step 2`), and nothing is written from the state after it. Two signs of a sick run are warnings (config
`health`): a loss above `loss_spike_factor` times the lowest loss so far, after the learning-rate warm-up; and a
gradient norm of exactly 0 for `zero_grad_steps` steps in a row. With `on_warning: stop` a warning ends the job
too. Imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from slidedp.config import JobConfig


def _describe(value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return repr(value)


def non_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isfinite(value)


@dataclass
class HealthMonitor:
    """Reads each step's record in order (a resumed run starts again from its first record)."""

    cfg: JobConfig
    min_loss: float = math.inf
    zero_run: int = 0
    diverged: str | None = None  # the reason, once a step diverged
    diverged_step: int | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def check(self, record: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        """(divergence reason or None, the warnings this step raised). Warnings are {step, kind, message}."""
        step = int(record["step"])
        loss, norm = record.get("loss"), record.get("grad_norm")
        for name, value in (("loss", loss), ("gradient norm", norm)):
            if non_finite(value):
                reason = f"diverged: {name} is {_describe(value)} at step {step}"
                if self.diverged is None:
                    self.diverged, self.diverged_step = reason, step
                return reason, []
        raised: list[dict[str, Any]] = []
        h = self.cfg.health
        warm = max(self.cfg.schedule.warmup_steps, 1)
        if isinstance(loss, (int, float)):
            if step > warm and self.min_loss < math.inf and loss > h.loss_spike_factor * self.min_loss:
                raised.append({"step": step, "kind": "loss_spike",
                               "message": f"loss {loss:.4g} at step {step} is above {h.loss_spike_factor:g}x the "
                                          f"lowest loss so far ({self.min_loss:.4g}): the run may be diverging "
                                          "(a learning rate too high?)"})
            self.min_loss = min(self.min_loss, float(loss))
        if isinstance(norm, (int, float)):
            self.zero_run = self.zero_run + 1 if norm == 0.0 else 0
            if h.zero_grad_steps and self.zero_run == h.zero_grad_steps:
                raised.append({"step": step, "kind": "zero_grad",
                               "message": f"gradient norm is exactly 0 for {self.zero_run} steps in a row (steps "
                                          f"{step - self.zero_run + 1}-{step}): nothing is learning"})
        self.warnings.extend(raised)
        return None, raised

    @property
    def stop_reason(self) -> str | None:
        """Why the run must end now: divergence, or a warning when on_warning is stop."""
        if self.diverged is not None:
            return self.diverged
        if self.warnings and self.cfg.health.on_warning == "stop":
            return f"stopped by health.on_warning: {self.warnings[0]['message']}"
        return None


def finite_json(record: dict[str, Any]) -> dict[str, Any]:
    """The record with non-finite numbers as null (JSON has no NaN), recursively."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean(record)
