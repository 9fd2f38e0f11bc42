"""Start-up stages of a run: what train() is doing before its first step, and how long each part took.

Planning (and calibrating this host when its calibration is not cached), building the host state (random
initialisation, or loading the weights of a local model), starting the ranks, running the first step. Each stage
reaches `on_stage` as it begins (and with progress while the host state is filled); the durations go into the
log, into the first step's metrics record (`startup_s`) and into TrainResult.startup_s. Imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WORDS = {
    "planning": "planning the execution policy",
    "calibrating": "calibrating this host (cached for the next runs)",
    "building_host_state": "building the host state (random initial weights)",
    "loading_weights": "building the host state (loading the model's weights)",
    "loading_checkpoint": "loading the checkpoint into the host state",
    "opening_trackers": "opening the experiment trackers (report_to)",
    "starting_ranks": "starting the rank processes",
    "first_step": "running the first step",
}
PROGRESS_EVERY_S = 0.5  # at most two progress reports a second


class Startup:
    """The stages of one run's start. `enter` closes the running stage and opens the next; `finish` closes the
    last and returns {stage: seconds} in the order they ran.

    t0: when the start began (time.perf_counter(); default now): train() passes the moment it was called, so
    `total_s`, the time to first step, also counts what ran before the first stage (imports, validation)."""

    def __init__(self, on_stage: Callable[[dict], None] | None, on_log: Callable[[str], None] | None,
                 t0: float | None = None):
        self.on_stage, self.on_log = on_stage, on_log
        self.t0 = time.perf_counter() if t0 is None else t0
        self.current: str | None = None
        self.since = self.t0
        self.durations: dict[str, float] = {}
        self.parts: dict[str, dict[str, float]] = {}  # {stage: {part: seconds}}: what `mark` split a stage into
        self._mark_t = self.t0
        self._last_progress = 0.0
        self.done = False
        self.total_s: float | None = None  # from t0 to the end of the first step, once finish() has run

    def _emit(self, event: dict[str, Any]) -> None:
        if self.on_stage is not None:
            self.on_stage({**event, "elapsed_s": round(time.perf_counter() - self.t0, 3)})

    def _close(self) -> None:
        if self.current is not None:
            now = time.perf_counter()
            self.durations[self.current] = self.durations.get(self.current, 0.0) + now - self.since

    def enter(self, stage: str) -> None:
        if self.done or stage == self.current:
            return
        if stage not in WORDS:
            raise ValueError(f"unknown start-up stage {stage!r}; stages: {', '.join(WORDS)}")
        self._close()
        self.current, self.since = stage, time.perf_counter()
        self._mark_t = self.since
        if self.on_log is not None:
            self.on_log(f"start-up: {WORDS[stage]}")
        self._emit({"stage": stage})

    def mark(self, part: str) -> None:
        """Close one part of the running stage: the seconds since the stage began or since its last mark go into
        `parts[stage][part]` (the first record's `startup_parts_s`). A part marked twice in a stage adds up."""
        if self.done or self.current is None:
            return
        now = time.perf_counter()
        parts = self.parts.setdefault(self.current, {})
        parts[part] = parts.get(part, 0.0) + now - self._mark_t
        self._mark_t = now

    def parts_s(self) -> dict[str, dict[str, float]]:
        """{stage: {part: seconds}} rounded to the millisecond, for the stages that were marked."""
        return {stage: {k: round(v, 3) for k, v in parts.items()} for stage, parts in self.parts.items()}

    def progress(self, done: int, total: int) -> None:
        """Progress of the running stage (units of the host state filled); reported at most every 0.5 s and at
        the end."""
        now = time.perf_counter()
        if done < total and now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self._emit({"stage": self.current, "done": done, "total": total, "progress": done / max(total, 1)})

    def finish(self) -> dict[str, float]:
        """Close the start: {stage: seconds}, logged in one line and sent as the stage `training`."""
        if self.done:
            return dict(self.durations)
        self._close()
        self.done, self.current = True, None
        total = time.perf_counter() - self.t0
        self.total_s = round(total, 3)
        parts = ", ".join(f"{stage.replace('_', ' ')} {s:.1f} s" for stage, s in self.durations.items())
        if self.on_log is not None:
            self.on_log(f"start-up took {total:.1f} s: {parts}")
        out = {stage: round(s, 3) for stage, s in self.durations.items()}
        self._emit({"stage": "training", "durations": out, "total_s": round(total, 3)})
        return out

    def calibration_log(self, on_log: Callable[[str], None] | None) -> Callable[[str], None]:
        """The on_log to hand to calibration.load_or_calibrate: its first line (it logs only when it measures)
        opens the `calibrating` stage."""

        def log(line: str) -> None:
            self.enter("calibrating")
            if on_log is not None:
                on_log(line)

        return log
