"""The card sweep: what the same job would get with more or less memory on each GPU.

The plan answers for the job as configured; the sweep re-runs AutoPolicy's search with everything else the same
and the memory per GPU set to each of SIZES_GIB that lies below the card, to the job's own gpu_memory_gib, and to
the whole card. A size is planned as a gpu_memory_gib cap of that size on this card (the CUDA context counted in
it, as on a card that small), so that each row is a setting the user can try, and a row's budget never shrinks as
its size grows. The row of the job's own setting is the plan itself, and the predictions the plan already made
are reused (planning/autopolicy.py shares them), so a size costs only the policies its budget makes new.

    rows = card_sweep(plan, job, best_at)   # best_at(job) -> (policy, predicted) or raises Infeasible

Imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from slidedp.planning.job import GIB, Job
from slidedp.planning.plan import Plan, Prediction
from slidedp.planning.refusals import Infeasible

SIZES_GIB = (16, 24, 48, 80)  # consumer, workstation, and the two data-centre sizes below the large cards

# (policy as the plan JSON writes it, its prediction) for a job at one size
Chosen = tuple[dict[str, Any], Prediction]
BestAt = Callable[[Job], Chosen]
Searched = tuple[Chosen | None, str | None]  # a size's choice, or why nothing fits there
_WHOLE = -1  # the size key of the whole card


def policy_words(pol: dict[str, Any]) -> str:
    """A policy in a few words: routes, activation mix, residency and what is updated on the GPUs."""
    acts = pol["activations"]
    words = [
        f"{pol['delivery']}/{pol['grad_reduce']}",
        f"keep {acts.count('keep')}",
        f"offload {acts.count('offload')}",
        f"checkpoint {acts.count('checkpoint')}",
    ]
    if sum(pol["resident"]):
        words.append(f"resident {sum(pol['resident'])}")
    on_gpu = (["edges"] if pol["edge_update"] == "gpu" else []) + (
        [f"{pol['device_layers']} layers"] if pol["device_layers"] else []
    )
    if on_gpu:
        words.append("GPU updates " + " + ".join(on_gpu))
    return ", ".join(words)


def _row(gib: float, chosen: Chosen | None, why_not: str | None, current: bool, whole: bool) -> dict[str, Any]:
    pol, pred = chosen if chosen is not None else (None, Prediction(step_time_s=None))
    return {
        "hbm_gib": gib,
        "fits": chosen is not None,
        "step_time_s": pred.step_time_s,
        "tokens_per_s": pred.tokens_per_s,
        "hbm_peak_gib": pred.hbm_peak_gib,
        "policy": policy_words(pol) if pol is not None else None,
        "why_not": why_not,
        "current": current,
        "whole_card": whole,
    }


def card_sweep(plan: Plan, job: Job, best_at: BestAt,
               side_by_side: Callable[[Callable[[int], Searched], list[int]], list[Searched]] | None = None,
               ) -> list[dict[str, Any]]:
    """Rows by memory per GPU, smallest first, the whole card last; `current` marks the job's own setting, whose
    row is `plan` (the plan_job result for `job`). Empty for jobs that run on no GPU.

    Sizes are planned from the largest down: a size whose budget still holds the choice of the size above it
    gets that choice without a search (it was the best with more room, and it fits here), so a job that fills
    only part of the card costs little to sweep. `side_by_side` (planning/forked.py's fork_map): every size's
    search made up front, side by side, and the same rule applied to their answers: the same rows, sooner where
    the searches are long, with the searches the rule would have skipped made too."""
    if not job.on_gpu or not job.hbm_bytes:
        return []
    card, cap = job.hbm_bytes, job.hbm_cap_bytes
    # the job's own row: the whole card without a cap (or with one of the card's size), none when the cap is
    # above the card (the plan refuses it)
    own = _WHOLE if cap is None or cap == card else (cap if cap < card else None)
    sizes = {int(s * GIB) for s in SIZES_GIB if s * GIB < card} | ({own} if own not in (None, _WHOLE) else set())
    order = [_WHOLE, *sorted(sizes, reverse=True)]

    def at_size(size: int) -> Job:
        return dataclasses.replace(job, hbm_cap_bytes=None if size == _WHOLE else size)

    def search(size: int) -> Searched:
        try:
            return best_at(at_size(size)), None
        except Infeasible as exc:
            return None, "; ".join(e["msg"] for e in exc.errors)

    ahead: dict[int, Searched] = {}
    if side_by_side is not None:
        todo = [size for size in order if size != own]
        ahead = dict(zip(todo, side_by_side(search, todo)))
    rows, above = [], None
    for size in order:
        whole = size == _WHOLE
        gib = (card if whole else size) / GIB
        at = at_size(size)
        chosen, why_not = None, None
        if size == own:  # the plan itself
            if plan.feasible:
                chosen = plan.policy, plan.predicted
            else:
                why_not = plan.error_words() or plan.why
        elif above is not None and above[1].hbm_peak_gib * GIB <= at.hbm_budget:
            chosen = above
        else:
            chosen, why_not = ahead[size] if size in ahead else search(size)
        rows.append(_row(gib, chosen, why_not, size == own, whole))
        above = chosen
    return rows[::-1]
