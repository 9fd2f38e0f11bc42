"""AutoPolicy's choice of `policy.streamed_layers`: how many layers' updates after the gradient norm stream through
the GPUs (slidedp.step.streamed_update: the layers right after the device layers, so the host's are the last the
next forward needs) while the host CPU updates the rest.

Only with clipping, where the post-norm update would otherwise run on the host alone while the GPUs and their
links idle. Both sides are bound by memory traffic (the CPU by host DRAM, the stream by the link carrying 24
B/param beside the next forward's deliveries), so the best count splits the post-norm work between them, and it
is found by pricing a few splits of the layers the device does not update for good: a quarter, half and three
quarters of them, each with the device layers the route search chose and with half as many (the streamed
layers' waiting gradients and chunk buffers take GPU memory the device state held), its activation mix solved
again. From the fastest of those the count moves one layer at a time, down and up, while the step shortens (the
step against the count is a sharp V whose floor seldom sits on a quarter). The fastest that fits is kept; none
faster, none streamed. A calibration without the device AdamW rate cannot price it: none streamed.
"""

from __future__ import annotations

from typing import Any

from slidedp.planning.cost_model import Uncalibrated
from slidedp.planning.plan import Candidate
from slidedp.policy import ExecutionPolicy

SHARES = (0.25, 0.5, 0.75)  # of the layers above the device layers, tried as streamed counts


class StreamedSearch:
    """Mixed into the planner, which provides job, fixed, rates, base(), fits(), time(), solve_mix() and
    candidate()."""

    def sweep_streamed(self, pol: ExecutionPolicy, marginal: dict[str, Any],
                       candidates: list[Candidate]) -> tuple[ExecutionPolicy, dict[str, Any]]:
        j = self.job
        if not (j.clip and j.on_gpu and self.rates) or "streamed_layers" in self.fixed:
            return pol, marginal
        best, best_t = (pol, marginal), self.time(pol)
        tried: dict[tuple[int, int], float] = {}

        def price(device_layers: int, n: int) -> float:
            """The step of n streamed layers beside device_layers, its mix solved (inf where it does not fit);
            the fastest so far kept in `best`."""
            nonlocal best, best_t
            if (device_layers, n) in tried:
                return tried[(device_layers, n)]
            tried[(device_layers, n)] = float("inf")
            start = self.base(pol.delivery, pol.grad_reduce, pol.window, pol.chunk_mb, pol.loss_chunk_tokens,
                              {}, pol.edge_update, device_layers, streamed_layers=n)
            if self.fits(start) is not None:
                return float("inf")
            trial, trial_marginal = self.solve_mix(start)
            candidates.append(self.candidate(trial))
            if self.fits(trial) is None:
                tried[(device_layers, n)] = self.time(trial)
                if tried[(device_layers, n)] < best_t:
                    best, best_t = (trial, trial_marginal), tried[(device_layers, n)]
            return tried[(device_layers, n)]

        try:
            for device_layers in sorted({pol.device_layers, pol.device_layers // 2}, reverse=True):
                if device_layers != pol.device_layers and "device_layers" in self.fixed:
                    continue
                free = j.layers - device_layers
                for n in sorted({round(free * share) for share in SHARES} - {0}):
                    price(device_layers, n)
            if best[0] is not pol:  # the step is a sharp V in the count: walk from the best share one layer at a time
                device_layers, n = best[0].device_layers, best[0].streamed_layers
                for step in (-1, 1):
                    m = n + step
                    while 0 < m <= j.layers - device_layers and price(device_layers, m) <= best_t:
                        m += step
        except Uncalibrated:  # a calibration without the device AdamW rate cannot price the stream
            return pol, marginal
        return best
