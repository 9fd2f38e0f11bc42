"""Whether a job's decoder layers run compiled (policy.compiled_layers), and what the plan says of it.

A config that sets compiled_layers true or false is followed. Left to the planner (null, the default), the layers
are compiled when the calibration timed the compiled layer at the job's shape (`unit_compiled`, CUDA only) and it
is at least COMPILED_MIN_GAIN faster than the eager layer both ways a layer runs: kept (forward, then backward)
and checkpointed (forward without a graph, then recompute and backward), and the job has steps enough to win back
the compile: its steps times the most a step could save (every layer run it makes, on the path whose compiled layer
saves more) at least the compile's seconds as calibration measured them. Otherwise they stay eager: on the CPU
(the capture runs there without generating kernels, so it gains nothing), with a calibration that predates the
measurement or where the compile failed (the record keeps why), and where compiling does not pay.

The compiled figures price the step (cost_model.Rates.layer_s, memory_model.ActivationSizes: the compiled graph
saves other tensors for backward); the compile itself is paid once, by each rank at its start while the launcher
fills the host state (slidedp.step.compiled.warm), and is the plan's `compiled_layers.compile_s` as calibration
measured it (a warm compile cache on the host makes it shorter). A short job (a smoke test of a few steps) starts
sooner eager than it could finish compiled.

Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Compiled layers are chosen when both layer paths are at least this much faster: below it, the calibration's
# spread (1-2% between runs) could choose a compile that does not pay.
COMPILED_MIN_GAIN = 0.03


def measured(calibration: dict[str, Any] | None) -> dict[str, Any] | None:
    """The calibration's compiled-layer figures, None when it has none (or only the compile's failure)."""
    unit = (calibration or {}).get("unit_compiled")
    if not isinstance(unit, dict) or unit.get("error") or "fwd_keep_s" not in unit:
        return None
    return unit


def _paths(unit: dict[str, Any]) -> tuple[float, float]:
    """(kept layer: forward + backward, checkpointed layer: forward + recompute and backward) in seconds."""
    return unit["fwd_keep_s"] + unit["bwd_keep_s"], unit["fwd_checkpoint_s"] + unit["bwd_checkpoint_s"]


@dataclass(frozen=True)
class CompiledChoice:
    """The planner's answer: compiled or not, who decided (config | planner), and the figures it rests on."""

    compiled: bool
    by: str
    reason: str
    eager_layer_s: float | None = None  # a kept layer's forward + backward, eager
    compiled_layer_s: float | None = None  # the same, compiled
    compile_s: float | None = None
    failed: bool = False  # the compile failed when calibrating (the reason says how)

    @property
    def worth_saying(self) -> bool:
        """Whether a plan says how its layers run: when they are compiled, when calibration timed both kinds, or
        when the compile failed; not for a job whose layers could only be eager (CPU ranks, no calibration, one
        that predates the measurement)."""
        return self.compiled or self.compiled_layer_s is not None or self.failed

    def to_dict(self) -> dict[str, Any]:
        """The plan's `compiled_layers` (docs/interfaces.md §5)."""
        return {"chosen": self.compiled, "by": self.by, "eager_layer_s": self.eager_layer_s,
                "compiled_layer_s": self.compiled_layer_s, "compile_s": self.compile_s, "reason": self.reason}

    def words(self) -> str:
        """One sentence for the plan's why."""
        who = "as configured" if self.by == "config" else "the planner's choice"
        if self.compiled and self.compiled_layer_s is not None:
            return (f"Compiled layers ({who}): a layer's forward and backward take {self.compiled_layer_s * 1e3:.1f} "
                    f"ms against {self.eager_layer_s * 1e3:.1f} ms eager, as calibrated; each rank compiles them "
                    f"once at its start, beside the host state's fill ({self.compile_s:.0f} s when calibration "
                    "compiled them; less with the compile cache warm).")
        if self.compiled:
            return (f"Compiled layers ({who}): {self.reason}, so the step is priced with eager layers and is "
                    "likely high by what compiling saves; each rank compiles them once at its start.")
        return f"Eager layers ({who}): {self.reason}."


def choose_compiled(fixed: dict[str, Any], calibration: dict[str, Any] | None, on_gpu: bool,
                    steps: int | None = None, layer_runs: int = 1) -> CompiledChoice:
    """compiled_layers for a job: the config's when it sets it, else the rule above. `calibration` None: the plan
    has no times (its layers then stay eager unless configured). steps: the job's optimizer steps (None: as many
    as it takes to win the compile back); layer_runs: decoder layer runs a rank makes per step (layers x
    micro-batches it accumulates)."""
    unit = measured(calibration) if on_gpu else None
    failed = ((calibration or {}).get("unit_compiled") or {}).get("error") if on_gpu else None
    figures: dict[str, Any] = {"failed": bool(failed)}
    pays = False
    if not on_gpu:
        why = "on CPU ranks a compiled layer runs the same kernels as an eager one"
    elif calibration is None:
        why = "no calibration to time them"
    elif unit is None:
        why = (f"the compile failed when calibrating ({failed})" if failed
               else "a declared host's figures time eager layers only" if calibration.get("declared")
               else "the calibration did not time compiled layers (it predates them)")
    else:
        (kept_e, ckpt_e), (kept_c, ckpt_c) = _paths(calibration["unit"]), _paths(unit)
        figures.update(eager_layer_s=kept_e, compiled_layer_s=kept_c, compile_s=unit.get("compile_s"))
        gain = min(1 - kept_c / kept_e, 1 - ckpt_c / ckpt_e)
        pays = gain >= COMPILED_MIN_GAIN
        why = (f"compiling makes a layer {gain:.0%} faster (kept {kept_e * 1e3:.1f} -> {kept_c * 1e3:.1f} ms, "
               f"checkpointed {ckpt_e * 1e3:.1f} -> {ckpt_c * 1e3:.1f} ms)")
        if not pays and "compiled_layers" not in fixed:
            why += f", under the {COMPILED_MIN_GAIN:.0%} it takes to choose them"
        compile_s = unit.get("compile_s")
        if pays and steps is not None and compile_s:
            most = steps * layer_runs * max(kept_e - kept_c, ckpt_e - ckpt_c)
            if most < compile_s:
                pays = False
                if "compiled_layers" not in fixed:
                    why += (f", but this job's {steps} steps would save at most {most:.1f} s, less than the "
                            f"{compile_s:.0f} s its compile took when calibrating")
    if "compiled_layers" in fixed:
        return CompiledChoice(bool(fixed["compiled_layers"]), "config", why, **figures)
    return CompiledChoice(pays, "planner", why, **figures)
