"""What a run is, decided once in the launcher and handed to every rank typed: nothing downstream parses config.

The launcher (slidedp.launch.train) parses the job's config into a JobConfig, resolves its ExecutionPolicy
(slidedp.planning.resolve), lays out the host state for it (slidedp.step.layout) and reads the plan's prediction
once; a `RunSpec` carries those four, and each rank process (slidedp.step.rank) receives it, unpickled, as it was
made. Imports no torch.

    spec = RunSpec(config=cfg, policy=policy, layout=layout, predicted=metrics_prediction(plan), cpu_threads=8)
    spec.checkpoint_steps(start_step)      # the steps after which the ranks write a checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slidedp.config import JobConfig
from slidedp.policy import ExecutionPolicy
from slidedp.step.layout import HostLayout


@dataclass(frozen=True)
class CheckpointSteps:
    """The steps after which the ranks write a checkpoint: every `interval`-th step after `start`, and the last
    (none when interval is 0). Answers `in` without listing them (a 10**9-step run's list would not fit)."""

    start: int
    steps: int
    interval: int

    def __contains__(self, step: object) -> bool:
        if not self.interval or not isinstance(step, int) or not self.start < step <= self.steps:
            return False
        return step % self.interval == 0 or step == self.steps


@dataclass(frozen=True)
class RunSpec:
    """One run, resolved: the job's parsed config, the policy its ranks run, the host state's layout, the plan's
    prediction every metrics record carries ({} when nothing was planned, docs/interfaces.md §3) and each rank's
    CPU threads (slidedp.planning.job.rank_threads)."""

    config: JobConfig
    policy: ExecutionPolicy
    layout: HostLayout
    predicted: dict[str, float] = field(default_factory=dict)
    cpu_threads: int = 1

    def checkpoint_steps(self, start_step: int) -> CheckpointSteps:
        return CheckpointSteps(start_step, self.config.steps, self.config.checkpoint.interval)
