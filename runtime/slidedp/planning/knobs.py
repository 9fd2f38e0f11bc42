"""The knob sweep: window depth, transfer chunk and loss chunk around the route and activation mix the route
search chose, then the delivery cast's scratch and the gradient staging slots.

Each knob takes the user's value where one is set, else the options below (with times) or its default (without).
The route search runs at the defaults; the sweep then tries every combination, defaults first, refitting the mix
to the memory a knob frees or takes (planning/marginal.py's refill and shrink_to_fit), and a change is taken only
when it is at least 0.1% faster or makes a plan that did not fit fit. Imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from slidedp.config import PolicyConfig
from slidedp.planning.cost_model import Rates
from slidedp.planning.job import Job
from slidedp.planning.plan import Candidate
from slidedp.policy import ExecutionPolicy

WINDOWS = (2, 3, 4, 6)
CHUNKS_MB = (16, 64, 256)
LOSS_CHUNKS = (1024, 2048, 4096, 8192)
STAGING_SLOTS = (12, 16, 24, 32, 48)  # tried above the default (policy.staging_slots) where the model prices them
SLOTS_GAIN = 0.01  # more staging is taken only when this much faster: it holds host RAM and page-locking time
SLOTS_SHARE_OF_FREE = 0.25  # and only within this share of the host RAM the rest of the plan leaves free


@dataclasses.dataclass(frozen=True)
class StartKnobs:
    """The knobs the route search runs at: the user's or the defaults; the loss chunks the micro-batch allows."""

    window: int
    chunk_mb: int
    loss_chunk_tokens: int
    loss_chunks: list[int]


class KnobSearch:
    """Mixed into the planner, which provides job, fixed (the settings the user fixed: PolicyConfig.fixed()), rates,
    fits(), time(), candidate(), refill() and shrink_to_fit()."""

    job: Job
    fixed: dict[str, Any]
    rates: Rates | None

    def knob(self, name: str, options: tuple[int, ...]) -> list[int]:
        """The values of a knob to try: the user's, else these options with times, the default without."""
        if name in self.fixed:
            return [self.fixed[name]]
        return list(options) if self.rates else [PolicyConfig.default(name)]

    def start_knobs(self) -> StartKnobs:
        """The user's window and chunk or the defaults, and the loss chunk nearest the default that the
        micro-batch's tokens allow."""
        loss_chunks = [
            c for c in self.knob("loss_chunk_tokens", LOSS_CHUNKS) if c <= max(self.job.tokens_per_micro_batch, 1)
        ]
        loss_chunks = loss_chunks or [min(LOSS_CHUNKS)]
        return StartKnobs(
            window=self.fixed.get("window", PolicyConfig.default("window")),
            chunk_mb=self.fixed.get("chunk_mb", PolicyConfig.default("chunk_mb")),
            loss_chunk_tokens=min(loss_chunks, key=lambda c: abs(c - PolicyConfig.default("loss_chunk_tokens"))),
            loss_chunks=loss_chunks,
        )

    def sweep_knobs(
        self,
        pol: ExecutionPolicy,
        marginal: dict[str, Any],
        loss_chunks: list[int],
        candidates: list[Candidate],
    ) -> ExecutionPolicy:
        """The best policy of the sweep around `pol` (the route search's choice); every policy tried is appended
        to `candidates`."""
        # the cast scratch before and after the knobs around the best route and mix, defaults first (a change must
        # beat them by 0.1%): window depth, transfer chunk, and the loss chunk (a smaller one frees HBM that kept
        # activations can use)
        pol = self.sweep_cast_scratch(pol, marginal, candidates)
        for w in self._defaults_first("window", self.knob("window", WINDOWS)):
            if w >= pol.staging_slots:  # the user's slot count holds the window below it
                continue
            for c in self._defaults_first("chunk_mb", self.knob("chunk_mb", CHUNKS_MB)):
                for lc in self._defaults_first("loss_chunk_tokens", loss_chunks):
                    alt = dataclasses.replace(pol, window=w, chunk_mb=c, loss_chunk_tokens=lc)
                    alt = self.refill(self.shrink_to_fit(alt), marginal)
                    if alt is None or alt == pol:
                        continue
                    candidates.append(self.candidate(alt))
                    # a change must be 0.1% faster, or make a plan that does not fit fit
                    if self.time(alt) < self.time(pol) * 0.999 or (self.fits(pol) is not None
                                                                   and self.fits(alt) is None):
                        pol = alt
        if pol.cast_scratch_mb:  # taken before the knobs: kept where it still pays at theirs
            pol = self.sweep_cast_scratch(pol, marginal, candidates)
        return self.sweep_staging(pol, candidates)

    def sweep_cast_scratch(self, pol: ExecutionPolicy, marginal: dict[str, Any],
                           candidates: list[Candidate]) -> ExecutionPolicy:
        """Where the GPUs cast the deliveries, `pol` with and without the cast scratch calibration measured
        (policy.cast_scratch_mb, calibration's `delivery_cast`), the other one's GPU memory refitted from the rest of
        the plan: the scratch where that plan fits and it buys 0.1%. Tried before the window and chunk (a delivery
        that keeps pace can change which window pays) and, where taken, again after them (a larger transfer chunk can
        slow the default cast as little as the scratch does, whose buffers are then not the ring calibration
        measured)."""
        if (not self.rates or "cast_scratch_mb" in self.fixed
                or self.rates.cast_figure(pol) is None):  # no cast on the GPUs, or not measured
            return pol
        mb = 0 if pol.cast_scratch_mb else self.rates.c["delivery_cast"]["ring_mib"]
        alt = self.refill(self.shrink_to_fit(dataclasses.replace(pol, cast_scratch_mb=mb)), marginal)
        if alt is None or alt == pol or self.fits(alt) is not None:
            return pol
        candidates.append(self.candidate(alt))
        scratch, without = (alt, pol) if mb else (pol, alt)
        return scratch if self.time(scratch) < self.time(without) * 0.999 else without

    def cast_scratch_choice(self, policy: Mapping[str, Any]) -> dict[str, Any] | None:
        """The plan's `cast_scratch` where its policy casts through a scratch: its MiB, the step with it and the
        same policy's step without it, and whether the job set it; None where there is none or nothing is timed."""
        if not self.rates or policy.get("delivery_cast") != "gpu" or not policy.get("cast_scratch_mb"):
            return None
        chosen = ExecutionPolicy.from_dict(dict(policy))
        return {"mb": chosen.cast_scratch_mb, "step_time_s": self.time(chosen),
                "without_s": self.time(dataclasses.replace(chosen, cast_scratch_mb=0)),
                "fixed": "cast_scratch_mb" in self.fixed}

    def sweep_staging(self, pol: ExecutionPolicy, candidates: list[Candidate]) -> ExecutionPolicy:
        """More gradient staging slots than the default where the model prices them 1% faster: the backward then
        runs further ahead of the host update, which can keep updating through the next forward. Each slot is one
        unit of page-locked host RAM per rank, so they take at most a quarter of what the plan leaves free."""
        if "staging_slots" in self.fixed or not self.rates or self.fits(pol) is not None:
            return pol
        held = self.mem(pol)["host_bytes"]
        free = self.job.host_limit_bytes - held
        best = pol
        for n in STAGING_SLOTS:
            if n <= pol.staging_slots:
                continue
            alt = dataclasses.replace(pol, staging_slots=n)
            if self.mem(alt)["host_bytes"] - held > SLOTS_SHARE_OF_FREE * free:
                break
            candidates.append(self.candidate(alt))
            if self.time(alt) < self.time(best) * (1 - SLOTS_GAIN):
                best = alt
        return best

    def _defaults_first(self, name: str, options: list[int]) -> list[int]:
        d = PolicyConfig.default(name)
        return sorted(options, key=lambda v: (v != d, v))
