"""The plan JSON AutoPolicy writes (docs/interfaces.md §5): a policy's prediction (step time, phases, exposure,
HBM and host RAM part by part), a candidate (policy, prediction, whether it fits and why not), the chosen plan
with its candidates and why, the job as the planner saw it, and a refusal; and a metrics record's prediction read
back from a plan (metrics_prediction). Imports no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slidedp.planning.bound import bound
from slidedp.planning.clip_cost import clipping_cost
from slidedp.planning.cost_model import GIB, PHASES, Rates, predict
from slidedp.planning.job import HBM_BUDGET_FRACTION, Job
from slidedp.planning.memory_model import ALLOCATOR_SLACK, ActivationSizes
from slidedp.planning.plan import Candidate, JobSummary, Plan, Prediction
from slidedp.planning.report import shortlist
from slidedp.policy import ExecutionPolicy, staging_slots


def policy_out(pol: ExecutionPolicy) -> dict[str, Any]:
    return pol.to_dict()


# A refusal's keys in the order its JSON has always had them (a feasible plan's are Plan's own order).
REFUSAL_ORDER = ("feasible", "policy", "predicted", "candidates", "marginal", "why", "errors", "calibration",
                 "calibration_note", "job", "smallest_gpu_memory_gib", "card_sweep")


def refusal(errors: list[dict[str, str]], calibration: str) -> Plan:
    """The plan of a job that is refused: not feasible, no policy, the errors and each one's fix."""
    return Plan(
        feasible=False,
        why="not feasible: " + "; ".join(f"{e['loc']}: {e['msg']}" for e in errors),
        errors=tuple(errors),
        calibration=calibration,
        order=REFUSAL_ORDER,
    )


def metrics_prediction(plan: Plan | dict[str, Any] | None) -> dict[str, float]:
    """The `predicted` entry of every metrics record: {phase: s, "forward_span": s, "backward_span": s,
    "step_time_s": s, "update_busy": s}, {} without times. `plan` is the plan, or its JSON as a run records it ({}
    or a fallback when nothing was planned). update_busy: the seconds the plan keeps the host updater busy in a step
    (its `cpu` busy time, where the plan has one)."""
    if isinstance(plan, Plan):
        pred = plan.predicted
    else:
        raw = (plan or {}).get("predicted")
        pred = Prediction.from_dict(raw) if raw else None
    if pred is None or pred.step_time_s is None:
        return {}
    out = {
        **{p: float(pred.phases.get(p, 0.0)) for p in PHASES},
        **{f"{k}_span": float(v) for k, v in (pred.spans or {}).items()},
        "step_time_s": float(pred.step_time_s),
    }
    if pred.busy and "cpu" in pred.busy:
        out["update_busy"] = float(pred.busy["cpu"])
    return out


class PlanJson:
    """Mixed into the planner, which provides job, acts, rates, fixed (the settings the user fixed), mem(),
    fits(), simulated() (a policy's prediction, made once), fixed_mix() and route_why()."""

    job: Job
    acts: ActivationSizes
    rates: Rates | None
    fixed: dict[str, Any]

    def job_summary(self) -> JobSummary:
        j = self.job
        return JobSummary(
            world=j.world,
            params=j.params,
            layers=j.layers,
            tokens_per_step=j.tokens_per_step,
            interconnect=j.interconnect,
            on_gpu=j.on_gpu,
            cpu_threads_per_rank=j.cpu_threads,
            hbm_budget_gib=j.hbm_budget / GIB if j.hbm_budget else None,
            # what the budget is cut from: each GPU's memory, of which HBM_BUDGET_FRACTION is planned on (the rest
            # holds the CUDA context, NCCL and fragmentation); HBM parts include the allocator's slack
            hbm_card_gib=j.hbm_bytes / GIB if j.hbm_bytes else None,
            hbm_cap_gib=j.hbm_cap_bytes / GIB if j.hbm_cap_bytes is not None else None,  # gpu_memory_gib
            hbm_budget_fraction=HBM_BUDGET_FRACTION,
            allocator_slack_fraction=ALLOCATOR_SLACK,
            host_limit_gib=j.host_limit_bytes / GIB,
            host_limit_source=j.host_limit_source,
            activation_sizes="measured" if self.acts.measured else "estimated (no calibration)",
        )

    def predicted(self, pol: ExecutionPolicy, exposure: bool = False) -> Prediction:
        m, j = self.mem(pol), self.job
        memory = Prediction(
            step_time_s=None,
            hbm_peak_gib=m["hbm_peak_bytes"] / GIB if j.on_gpu else None,
            host_ram_gib=m["host_bytes"] / GIB,
            hbm_parts_gib={k: v * (1 + ALLOCATOR_SLACK) / GIB for k, v in m["hbm_parts"].items()} if j.on_gpu else {},
            host_parts_gib={k: v / GIB for k, v in m["host_parts"].items()},
        )
        if not self.rates:
            return memory
        p = predict(j, pol, self.rates, exposure=True) if exposure else self.simulated(pol)
        return dataclasses.replace(
            memory,
            step_time_s=p["step_time_s"],
            phases=p["phases"],
            spans=p["spans"],
            tokens_per_s=p["tokens_per_s"],
            exposed=p.get("exposed", {}),
            busy=p["busy"],
            # the chosen policy's physical bound from the same ceilings (docs/architecture.md §4)
            bound=bound(j, pol, self.rates) if exposure else None,
        )

    def candidate(self, pol: ExecutionPolicy) -> Candidate:
        why_not = self.fits(pol)
        return Candidate(policy=policy_out(pol), predicted=self.predicted(pol), fits=why_not is None, why_not=why_not)

    def result(
        self, pol: ExecutionPolicy, candidates: list[Candidate], marginal: dict | None, why: list[str] | None = None
    ) -> Plan:
        """The plan of a feasible job: the chosen policy with its prediction and exposure, the candidates (those
        the model cannot tell apart once), why (explain's unless given), the marginal costs and, with clipping,
        what it costs (planning/clip_cost.py)."""
        pred = self.predicted(pol, exposure=bool(self.rates))
        seen, unique = set(), []
        for c in sorted(candidates, key=lambda c: (not c.fits, c.predicted.step_time_s or 0.0)):
            p, t = c.policy, c.predicted.step_time_s
            # candidates the model cannot tell apart (e.g. transfer chunks on a link without chunk overhead)
            key = (
                p["delivery"],
                p["grad_reduce"],
                p["edge_update"],
                p["device_layers"],
                p["window"],
                p["loss_chunk_tokens"],
                tuple(p["activations"]),
                tuple(p["resident"]),
                None if t is None else round(t, 4),
            )
            if key not in seen:
                seen.add(key)
                unique.append(c)
        if why is None:
            why = self.explain(pol, pred, unique, marginal)
        return Plan(
            feasible=True,
            policy=policy_out(pol),
            predicted=pred,
            candidates=tuple(shortlist(unique, 24)),
            why=" ".join(why),
            marginal=marginal,
            job=self.job_summary(),
            clipping=clipping_cost(self, pol, pred),  # what clipping costs this plan: one more pricing
            compiled_layers=self.compiled.to_dict() if self.compiled.worth_saying else None,
        )

    def explain(self, pol: ExecutionPolicy, pred: Prediction, cands: list[Candidate],
                marginal: dict | None) -> list[str]:
        """Why, sentence by sentence: the route and the best time of each, the activation mix and what one layer
        switched from checkpoint changes, the most exposed resource, clipping, the knobs the planner chose."""
        j, why = self.job, []
        routes = {}
        for c in cands:
            p = c.policy
            key = (p["delivery"], p["grad_reduce"] + ("/edge-gpu" if p["edge_update"] == "gpu" else ""))
            if c.fits and (key not in routes or c.predicted.step_time_s < routes[key]):
                routes[key] = c.predicted.step_time_s
        why.append(self.route_why(pol, routes))
        if len(routes) > 1:
            why.append(
                "Best step time per route: "
                + ", ".join(
                    f"{d}/{g} {t:.3f} s" for (d, g), t in sorted(routes.items(), key=lambda kv: kv[1])
                )
                + "."
            )
        c = pol.counts()
        mix = f"{c['keep']} keep, {c['offload']} offload, {c['checkpoint']} checkpoint; {sum(pol.resident)} resident"
        if marginal and marginal.get("delta_s"):
            d = marginal["delta_s"]
            terms = ", ".join(f"{k} {v * 1e3:+.1f} ms" for k, v in d.items())
            why.append(
                f"Activations: {mix} (per layer, switching from checkpoint changes the step by {terms}; "
                f"a layer saves {marginal['k_bytes'] / GIB:.2f} GiB of activations)."
            )
        else:
            why.append(f"Activations: {mix}" + (" (as configured)." if self.fixed_mix() else "."))
        if pred.exposed:
            top = max(pred.exposed.items(), key=lambda kv: kv[1])
            if top[1] > 0.01 * pred.step_time_s:
                why.append(
                    f"Most exposed: {top[0]} ({top[1]:.3f} s of the {pred.step_time_s:.3f} s step)."
                )
        if j.clip:
            why.append(
                "Exact clipping: updates wait for the global norm (step ~ backward + max(forward, update))."
            )
        if self.compiled.worth_saying:
            why.append(self.compiled.words())
        knobs = [k for k in ("window", "chunk_mb", "loss_chunk_tokens") if k not in self.fixed]
        if knobs:
            why.append("Planner-chosen " + ", ".join(f"{k}={getattr(pol, k)}" for k in knobs) + ".")
        if "staging_slots" not in self.fixed and pol.staging_slots < staging_slots(pol.window):
            why.append(f"Staging: {pol.staging_slots} gradient slots instead of the default "
                       f"{staging_slots(pol.window)}, so the host state fits its RAM (each slot holds the largest "
                       "unit's gradient).")
        return why
