"""Run health: tells a diverged or dead run from a good one, step by step, from the metrics records.

A non-finite loss or gradient norm is divergence: the job ends as failed with the reason (`diverged: loss is NaN
at step 2`), and nothing is written from the state after it. A dead run ends the same way by default (config
`health.on_dead`): a gradient norm of exactly 0 for `zero_grad_steps` steps in a row, or a loss above
`loss_spike_factor` times the lowest loss so far that is not back under that line within `spike_recovery_steps`
steps. A spike that comes back is a warning, as is everything with `on_dead: warn`; `on_warning: stop` ends the job
on a warning too. Every check runs from the second step on: a learning rate too high for the model shows as soon as
the warm-up lets it, and a run that dies in its warm-up is as dead as one that dies after. Imports no torch.
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
    spike: tuple[int, float, float] | None = None  # (step, loss, the line it has to come back under) while it has not
    diverged: str | None = None  # the reason, once a step diverged or the run died
    diverged_step: int | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def _die(self, reason: str, step: int) -> str:
        if self.diverged is None:
            self.diverged, self.diverged_step = reason, step
        return self.diverged

    def check(self, record: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        """(divergence reason or None, the warnings this step raised). Warnings are {step, kind, message}."""
        step = int(record["step"])
        loss, norm = record.get("loss"), record.get("grad_norm")
        for name, value in (("loss", loss), ("gradient norm", norm)):
            if non_finite(value):
                return self._die(f"diverged: {name} is {_describe(value)} at step {step}", step), []
        raised: list[dict[str, Any]] = []
        dead: str | None = None
        h = self.cfg.health
        if isinstance(loss, (int, float)):
            line = h.loss_spike_factor * self.min_loss
            if self.min_loss < math.inf and loss > line:
                raised.append({"step": step, "kind": "loss_spike",
                               "message": f"loss {loss:.4g} at step {step} is above {h.loss_spike_factor:g}x the "
                                          f"lowest loss so far ({self.min_loss:.4g}): the run may be diverging "
                                          "(a learning rate too high?)"})
                if self.spike is None:
                    self.spike = (step, float(loss), line)
            if self.spike is not None and loss <= self.spike[2]:
                self.spike = None  # it came back: the spike stays a warning
            elif self.spike is not None and step - self.spike[0] >= h.spike_recovery_steps:
                first, peak, line = self.spike
                dead = (f"diverged: the loss jumped to {peak:.4g} (above {h.loss_spike_factor:g}x the lowest loss "
                        f"before it, {line / h.loss_spike_factor:.4g}) and stayed above {line:.4g} for "
                        f"{h.spike_recovery_steps} steps, at step {first}")
                dead_step = first
            self.min_loss = min(self.min_loss, float(loss))
        if isinstance(norm, (int, float)):
            self.zero_run = self.zero_run + 1 if norm == 0.0 else 0
            if h.zero_grad_steps and self.zero_run == h.zero_grad_steps:
                first = step - self.zero_run + 1
                raised.append({"step": step, "kind": "zero_grad",
                               "message": f"gradient norm is exactly 0 for {self.zero_run} steps in a row (steps "
                                          f"{first}-{step}): nothing is learning"})
                if dead is None:
                    dead = (f"diverged: the gradient norm is exactly 0 for {self.zero_run} steps in a row (steps "
                            f"{first}-{step}), so nothing is learning, at step {first}")
                    dead_step = first
        self.warnings.extend(raised)
        if dead is not None and h.on_dead == "fail":
            return self._die(dead, dead_step), raised
        return None, raised

    @property
    def suspect(self) -> bool:
        """Whether the run may be dying: a spike not yet back, or a zero gradient norm on the last step. A
        checkpoint written now may hold a dead state, so none of the earlier ones may be rotated away for it."""
        return self.spike is not None or self.zero_run > 0

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
