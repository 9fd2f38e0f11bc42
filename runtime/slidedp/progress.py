"""A training run's progress on the console, as `slidedp train` shows it.

On a terminal: a progress bar (tqdm) with the elapsed time, the time left and the newest step's loss, tokens/s and
step time; the other log lines print above it. Anywhere else (a job log, a pipe): the step lines as
slidedp.train's on_log gives them, each with the elapsed time and the time left appended, e.g.
``step     4/60 | loss 5.1291 | ... | rss 0.3 GiB | 0:03 elapsed, ETA 0:15``.

Elapsed counts from the moment the TrainProgress is made (set-up included). The time left is the steps still to
run times the wall time per step, measured from the first step this run reports to the newest (the first step's
own step_time_s until a second one is reported), so neither the set-up nor a resumed run's earlier steps skew it.

Usage: ``with TrainProgress(cfg.steps) as progress: train(cfg, on_log=progress.log, on_step=progress.step)``.
No torch here.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import IO

from tqdm import tqdm

# the line slidedp.launch._format_step writes for each step: "step     4/60 | loss ..."
STEP_LINE = re.compile(r"^step +(\d+)/(\d+) \|")

BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA {remaining}{postfix}]"


def format_duration(seconds: float) -> str:
    """0:07, 12:34, 1:02:03."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class _StepBar(tqdm):
    """tqdm whose elapsed time and rate are the run's (TrainProgress's), not its own from its creation."""

    def __init__(self, *args, clock: Callable[[], tuple[float, float | None]], **kwargs):
        self._clock = clock  # before tqdm's __init__, which may render the bar
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self):
        d = super().format_dict
        d["elapsed"], d["rate"] = self._clock()
        return d


def _reports_no_size(stream) -> bool:
    """A terminal that says it is 0 columns wide (a pseudo-terminal nobody sized): tqdm would print nothing."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return size.columns <= 0 or size.lines <= 0


class TrainProgress:
    """The console side of a run: `log` is slidedp.train's on_log, `step` its on_step.

    total_steps: the run's last step (cfg.steps). stream: where to write (sys.stdout by default). bar: True for the
    progress bar, False for plain lines, None for the bar exactly when the stream is a terminal. clock: seconds,
    monotonic (time.monotonic; tests pass their own)."""

    def __init__(self, total_steps: int, stream: IO[str] | None = None, bar: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total = total_steps
        self.stream = stream if stream is not None else sys.stdout
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.use_bar = bar
        self._now = clock
        self._t0 = clock()
        self._first: tuple[int, float, float] | None = None  # (step, time it was reported, its step_time_s)
        self._last: tuple[int, float] | None = None  # (step, time it was reported)
        # the step line on_log gave, waiting for its record, and the lines logged after it (that step's warnings)
        self._pending: list[str] = []
        self._bar: _StepBar | None = None

    # ---- timing
    def elapsed(self) -> float:
        return self._now() - self._t0

    def seconds_per_step(self) -> float | None:
        """Wall time per step so far (None before the first step is reported)."""
        if self._first is None or self._last is None:
            return None
        step0, t_first, first_step_s = self._first
        step, t = self._last
        if step > step0:
            return (t - t_first) / (step - step0)
        return first_step_s

    def eta(self) -> float | None:
        """Seconds until the last step, at the rate so far (None before the first step is reported)."""
        sps = self.seconds_per_step()
        if sps is None or self._last is None:
            return None
        return max(0, self.total - self._last[0]) * sps

    def _bar_clock(self) -> tuple[float, float | None]:
        sps = self.seconds_per_step()
        return self.elapsed(), (1.0 / sps if sps else None)

    # ---- the callbacks
    def log(self, line: str) -> None:
        """on_log: a step line is held until its record comes (step, called next), and so are the lines logged
        between the two (that step's warnings), to follow it; any other line is printed (above the bar on a
        terminal)."""
        if STEP_LINE.match(line):
            self._flush_pending()
            self._pending = [line]
        elif self._pending:
            self._pending.append(line)
        else:
            self._write(line)

    def step(self, record: dict) -> None:
        """on_step: one optimizer step's metrics record."""
        step = int(record["step"])
        now = self._now()
        if self._first is None:
            self._first = (step, now, float(record.get("step_time_s") or 0.0))
        self._last = (step, now)
        held, self._pending = self._pending, []
        line, after = (held[0], held[1:]) if held else (f"step {step:>5}/{self.total} | loss {record['loss']:.4f}", [])
        if self.use_bar:
            self._advance(step, record)
        else:
            eta = self.eta()
            self._print(f"{line} | {format_duration(self.elapsed())} elapsed, "
                        f"ETA {format_duration(eta) if eta is not None else '?'}")
        for extra in after:
            self._write(extra)

    def close(self) -> None:
        """Print a held step line and leave the bar where it is; the stream is free for other output."""
        self._flush_pending()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> TrainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- output
    def _advance(self, step: int, record: dict) -> None:
        postfix = f"loss={record['loss']:.4f}, tok/s={record['tokens_per_s']:,.0f}, step={record['step_time_s']:.3f}s"
        n = max(0, min(step, self.total))
        if self._bar is None:  # made at the first step: a resumed run's bar starts where it resumed
            size = {"ncols": 100, "nrows": 24} if _reports_no_size(self.stream) else {"dynamic_ncols": True}
            self._bar = _StepBar(total=self.total, initial=n, postfix=postfix, desc="train", unit="step",
                                 file=self.stream, bar_format=BAR_FORMAT, mininterval=0, miniters=1, leave=True,
                                 clock=self._bar_clock, **size)
            return
        self._bar.set_postfix_str(postfix, refresh=False)
        if n > self._bar.n:
            self._bar.update(n - self._bar.n)
        else:
            self._bar.refresh()

    def _flush_pending(self) -> None:
        held, self._pending = self._pending, []
        for line in held:  # a step line whose record never came, and what followed it
            self._write(line)

    def _write(self, line: str) -> None:
        if self._bar is not None:
            tqdm.write(line, file=self.stream)
            self.stream.flush()
        else:
            self._print(line)

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
