"""AutoPolicy: choose the execution policy of a job — routes, window, transfer chunk, loss chunk, per-layer
activation placement and weight residency — from the cost model, and say why.

Imports no torch (the web API previews plans). `slidedp plan --config job.yaml` prints format_plan(plan_job(...)).

    plan = plan_job(cfg, topology, calibration)      # calibration None -> memory fit only, no times
    print(format_plan(plan))

This module holds the entry points and the planner: the job and what the user fixed, a policy's memory, fit and
predicted step time, and the order of the search. The search itself is in parts, one module each:

- planning/routes.py: the routes (delivery, gradient route, edge and device updates), compared by predicted step
  time, or chosen by the topology without times;
- planning/marginal.py: the activation mix and residency of a route, by the paper's marginal pipeline cost (with
  our reading of it);
- planning/knobs.py: window, transfer chunk and loss chunk swept around the chosen route and mix;
- planning/refusals.py: a job that cannot fit, refused with what to change;
- planning/plan_json.py: the plan JSON (predictions, candidates, why) and metrics_prediction;
- planning/card_sweep.py: the same search at other memory sizes per GPU (the plan's card_sweep);
- planning/basis.py: what a plan was made on (plan_basis, basis_change).

docs/planning.md has the details.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Protocol

from slidedp.planning.basis import TOPOLOGY_PARTS as TOPOLOGY_PARTS
from slidedp.planning.basis import basis_change as basis_change
from slidedp.planning.basis import calibration_identity as calibration_identity
from slidedp.planning.basis import plan_basis
from slidedp.planning.basis import topology_facts as topology_facts
from slidedp.planning.card_sweep import card_sweep
from slidedp.planning.compiled_choice import CompiledChoice, choose_compiled
from slidedp.planning.cost_model import GIB, Job, Rates, Uncalibrated, offload_backlog, predict
from slidedp.planning.forked import can_fork, fork_map
from slidedp.planning.knobs import CHUNKS_MB as CHUNKS_MB
from slidedp.planning.knobs import LOSS_CHUNKS as LOSS_CHUNKS
from slidedp.planning.knobs import WINDOWS as WINDOWS
from slidedp.planning.knobs import KnobSearch, StartKnobs
from slidedp.planning.marginal import MixSearch
from slidedp.planning.memory_model import ActivationSizes, memory
from slidedp.planning.plan import Candidate, Plan, Prediction
from slidedp.planning.plan_json import PlanJson, refusal
from slidedp.planning.plan_json import metrics_prediction as metrics_prediction
from slidedp.planning.profiles import declared_note
from slidedp.planning.refusals import Infeasible, Refusals, ways_out
from slidedp.planning.report import format_plan as format_plan
from slidedp.planning.routes import RouteSearch
from slidedp.planning.streamed import StreamedSearch
from slidedp.policy import ExecutionPolicy


class CastProcess(Protocol):
    """What plans the host cast beside this process (planning/cast_process.py's CastProcess): given the job by
    `submit` (False: it cannot take it), its plan by `result` (None: it gave none)."""

    def submit(self, cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
               fewer_slots: bool) -> bool: ...

    def result(self, own_search_s: float) -> Plan | None: ...

__all__ = ["basis_change", "format_plan", "metrics_prediction", "plan_basis", "plan_for", "plan_job"]

# The preview warns when a plan leaves less than this share of its GPU memory budget free (LOW_HEADROOM in
# frontend/src/planview/glance.ts): an error of that size in the memory prediction would run the job out of memory.
HEADROOM_MARGIN = 0.05
# A card sweep runs its sizes' searches side by side (planning/forked.py) where the plan's own search took at
# least this long: shorter ones cost less than the forks.
SIDE_BY_SIDE_MIN_S = 0.25
# ... and with the delivery cast left to AutoPolicy plans and sweeps both casts side by side on a host of at least
# this many cores (the losing cast's sweep is work done for nothing: on fewer cores it only competes).
SWEPT_APART_MIN_CORES = 4
# A plan that keeps the margin is taken over a fastest that does not when it is at most this much slower.
HEADROOM_SLOWER = 0.02
HEADROOM_RULE = (f"a plan leaving under {HEADROOM_MARGIN:.0%} of the GPU memory budget free is not chosen when one "
                 f"at most {HEADROOM_SLOWER:.0%} slower keeps that much free (fewer layers keeping activations, "
                 "resident or updated on the GPUs); otherwise the fastest is kept")


def plan_job(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
             sweep: bool = False, beside: CastProcess | None = None) -> dict[str, Any]:
    """The plan JSON for a job on a host (docs/interfaces.md §5): plan_for's plan as the CLI, the web service and
    a run's plan record hold it."""
    return plan_for(cfg, topology, calibration, sweep, beside).to_dict()


def plan_for(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None, sweep: bool = False,
             beside: CastProcess | None = None) -> Plan:
    """The plan for a job on a host: chosen policy, prediction, candidates, why, and the basis it was made on
    (plan_basis), so that a later run can tell whether it still holds. `sweep` adds the card sweep
    (planning/card_sweep.py): the same search at other memory sizes per GPU, which costs about one more search per
    size whose budget binds, so only what a person reads asks for it (`slidedp plan`, the web preview).
    `beside`: a planning process (planning/cast_process.py) that searches the host cast while this one searches
    the GPU cast, where both are searched; the plan is the same with it or without."""
    plan = _planned(cfg, topology, calibration, sweep, beside=beside)
    if not plan.feasible:  # what to change: each way planned by memory alone (planning/refusals.py)
        ways = ways_out(cfg, plan, len(topology.get("gpus", [])),
                        lambda changed: _planned(changed, topology, calibration, timed=False))
        if ways:
            plan = _name_the_cap_that_fits(dataclasses.replace(plan, ways_out=ways), ways)
    plan = _declared(plan, topology)
    return dataclasses.replace(plan, basis=plan_basis(cfg, topology, calibration))


def _name_the_cap_that_fits(plan: Plan, ways: list[dict[str, Any]]) -> Plan:
    """The refusal's smallest gpu_memory_gib is priced on the leanest policy at the refused cap, and a larger cap's
    own start can take a little more: where the ways out found that the named cap itself refuses, the refusal
    names the cap that was found to fit instead."""
    named = plan.smallest_gpu_memory_gib
    fits = next((w["change"]["gpu_memory_gib"] for w in ways if "gpu_memory_gib" in w["change"]), None)
    if named is None or fits is None or fits == named:
        return plan
    errors = tuple(
        {**err, "msg": err["msg"].replace(f"that fits is {named:g} GiB", f"that fits is {fits:g} GiB")}
        if err.get("loc") == "gpu_memory_gib" else err
        for err in plan.errors
    )
    return dataclasses.replace(plan, smallest_gpu_memory_gib=fits, errors=errors)


def _planned(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None, sweep: bool = False,
             timed: bool = True, beside: CastProcess | None = None) -> Plan:
    """The plan of the job; where it is refused on GPUs and the staging slots are the planner's, the same
    planning again with fewer gradient staging slots than the window's default wherever the default leaves the
    host short of RAM (_Planner.staging_that_fits): the plan that fits with them, or the refusal at the fewest
    slots, whose shortfall is then what the job really lacks. A job that fits with the default keeps it."""
    plan = _planned_once(cfg, topology, calibration, sweep, timed, fewer_slots=False, beside=beside)
    if plan.feasible or cfg.gpus == 0 or "staging_slots" in cfg.policy.fixed():
        return plan
    return _planned_once(cfg, topology, calibration, sweep, timed, fewer_slots=True)


def _planned_once(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None, sweep: bool,
                  timed: bool, fewer_slots: bool, beside: CastProcess | None = None) -> Plan:
    if "delivery_cast" not in cfg.policy.fixed():  # the cast left to AutoPolicy: the job planned both ways
        return _cast_choice(cfg, topology, calibration, sweep, timed, fewer_slots, beside)
    return _plan(cfg, topology, calibration, sweep, timed, fewer_slots=fewer_slots)


def searches_both_casts(cfg: Any) -> bool:
    """Whether the job's plan searches both delivery casts (_cast_choice): a bf16 job on GPUs whose delivery_cast
    is left to AutoPolicy."""
    return cfg.gpus > 0 and cfg.precision == "bf16" and "delivery_cast" not in cfg.policy.fixed()


def _with_cast(cfg: Any, cast: str) -> Any:
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, delivery_cast=cast))


def _cast_choice(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
                 sweep: bool, timed: bool = True, fewer_slots: bool = False, beside: CastProcess | None = None) -> Plan:
    """policy.delivery_cast auto: the job planned with the bf16 cast on the host and on the GPUs, and the faster
    plan that fits taken (the host's on a tie, without times, in fp32 or on the CPU, where the cast changes nothing
    or cannot be priced). `delivery_cast_choice` says what each cast would have given. `beside` (without the card
    sweep): the host cast searched there meanwhile (host_cast_plan), or here where it gives no plan. With the card
    sweep, on a host of SWEPT_APART_MIN_CORES or more where this process may fork (planning/forked.py), each cast is
    planned and swept in a copy of its own, side by side, and the chosen cast's sweep kept."""
    if not searches_both_casts(cfg):
        return _plan(_with_cast(cfg, "host"), topology, calibration, sweep, timed, fewer_slots=fewer_slots)
    job = _sized(cfg, topology)  # one job for both casts: the cast is the policy's, priced by each plan
    away = (beside is not None and timed and not sweep and not isinstance(job, Plan)
            and beside.submit(cfg, topology, calibration, fewer_slots))
    searched = time.perf_counter()

    def planned_as(cast: str) -> tuple[Plan, Any]:  # the cast's plan, and what adds its card sweep
        return _plan_and_sweep(_with_cast(cfg, cast), topology, calibration, timed=timed, job=job,
                               fewer_slots=fewer_slots)

    def swept(cast: str) -> tuple[Plan, Plan]:  # the cast's plan, and the same plan with its card sweep
        plan, sweep_of = planned_as(cast)
        return plan, sweep_of(plan)

    if (sweep and timed and not isinstance(job, Plan) and (os.cpu_count() or 1) >= SWEPT_APART_MIN_CORES
            and can_fork()):
        host_swept, gpu_swept = fork_map(swept, ["host", "gpu"])
        planned = {"host": (host_swept[0], lambda _: host_swept[1]), "gpu": (gpu_swept[0], lambda _: gpu_swept[1])}
    else:
        planned = {cast: planned_as(cast) for cast in (("gpu",) if away else ("host", "gpu"))}
    if away:
        host_plan = beside.result(own_search_s=time.perf_counter() - searched)
        planned = {"host": (host_plan, _no_sweep) if host_plan is not None else planned_as("host"), **planned}
    plans = {cast: p for cast, (p, _) in planned.items()}

    def moved_edges(plan: Plan) -> bool:  # memory alone put the embedding and head on the GPU to fit
        return plan.step_time_s is None and "edge_update" not in cfg.policy.fixed() and plan.policy[
            "edge_update"] == "gpu"

    host, gpu = plans["host"], plans["gpu"]
    if host.feasible and gpu.feasible:
        if host.step_time_s is not None and gpu.step_time_s is not None:
            chosen = "gpu" if gpu.step_time_s < host.step_time_s else "host"
        else:  # without times the host's, unless it fits only by moving what the GPU cast leaves in place
            chosen = "gpu" if moved_edges(host) and not moved_edges(gpu) else "host"
    elif gpu.feasible:
        chosen = "gpu"
    else:  # neither fits: a refusal for host RAM is the GPU cast's, the leaner there (the host's would name the
        # bf16 copy the GPU cast drops, and may advise that cast); any other is the host's
        chosen = "gpu" if any("host RAM too small" in e["msg"] for e in host.errors) else "host"
    plan, sweep_of = planned[chosen]
    if sweep:  # the chosen cast's planner sweeps the cards (its predictions kept: no second search)
        plan = sweep_of(plan)
    return dataclasses.replace(plan, delivery_cast_choice={
        "chosen": chosen,
        **{cast: {"fits": p.feasible, "step_time_s": p.step_time_s,
                  "why_not": None if p.feasible else p.error_words()}
           for cast, p in plans.items()},
    })


def host_cast_plan(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
                   fewer_slots: bool) -> Plan:
    """The host cast's plan of a job whose cast is AutoPolicy's, as _cast_choice makes it (without the card sweep):
    what a planning process beside it (planning/cast_process.py) sends back."""
    return _plan_and_sweep(_with_cast(cfg, "host"), topology, calibration, timed=True, job=_sized(cfg, topology),
                           fewer_slots=fewer_slots)[0]


def _sized(cfg: Any, topology: dict[str, Any]) -> Job | Plan:
    """The job as the planner sees it (no policy choice in it: every cast is priced from it), or the refusal of a
    model that cannot be sized."""
    try:
        return Job.from_config(cfg, topology)
    except (KeyError, OSError, ValueError, TypeError) as exc:
        return refusal([{"loc": "model", "msg": f"cannot size the model: {exc}"}], "missing")


def _plan(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None,
          sweep: bool = False, timed: bool = True, job: Job | Plan | None = None, fewer_slots: bool = False) -> Plan:
    """One cast's plan (the cast is cfg's policy's); `timed` False plans by memory alone (the calibration then
    sizes activations only). `job`: the job _sized already (the same for every cast), else sized here. `sweep`
    adds the card sweep."""
    plan, sweep_of = _plan_and_sweep(cfg, topology, calibration, timed, job, fewer_slots)
    return sweep_of(plan) if sweep else plan


def _no_sweep(plan: Plan) -> Plan:
    return plan


def _plan_and_sweep(cfg: Any, topology: dict[str, Any], calibration: dict[str, Any] | None, timed: bool = True,
                    job: Job | Plan | None = None, fewer_slots: bool = False) -> tuple[Plan, Any]:
    """_plan's plan without the card sweep, and what adds the sweep to it: the same planner's search at other
    memory sizes per GPU (planning/card_sweep.py), sharing the predictions the plan's search made."""
    job = _sized(cfg, topology) if job is None else job
    if isinstance(job, Plan):
        return job, _no_sweep
    if cfg.gpus > len(topology.get("gpus", [])):
        n = len(topology.get("gpus", []))
        host = f"the declared host {topology['declared']['profile']}" if topology.get("declared") else "this host"
        return refusal(
            [
                {
                    "loc": "gpus",
                    "msg": f"asks for {cfg.gpus} GPUs but {host} has {n}; "
                    f"set gpus to at most {n} (0 trains on the CPU)",
                }
            ],
            "missing",
        ), _no_sweep
    rates, note = None, "no calibration given: memory fit only, no step times"
    if calibration and timed:
        try:
            if (calibration.get("device") == "cuda") != job.on_gpu:
                raise Uncalibrated(
                    f"measured on {calibration.get('device')}, the job runs on {'cuda' if job.on_gpu else 'cpu'}"
                )
            rates, note = Rates(calibration, job), "measured on this host"
            if calibration.get("declared"):  # a profile's figures (planning/profiles.py), never measured
                note = declared_note(calibration["declared"])
        except (Uncalibrated, KeyError, TypeError) as exc:
            note = f"calibration unusable ({exc}): memory fit only, no step times"
    # compiled layers or eager, decided before the search (the activation sizes depend on it)
    compiled = choose_compiled(cfg.policy.fixed(), calibration if rates else None, job.on_gpu, steps=cfg.steps,
                               layer_runs=job.layers * job.grad_accum)
    acts = ActivationSizes.of(job, calibration, compiled.compiled)
    planner = _Planner(cfg, job, rates, acts, compiled=compiled, fewer_slots=fewer_slots)

    started = time.perf_counter()
    searched_s = 0.0  # how long the plan's own search took, set once it ends

    def sweep_of(plan: Plan) -> Plan:
        # the sizes side by side where the plan's own search was long enough for forks to pay (planning/forked.py)
        apart = fork_map if searched_s >= SIDE_BY_SIDE_MIN_S else None
        return dataclasses.replace(plan, card_sweep=card_sweep(plan, job, planner.best_at, apart))

    try:
        plan = planner.run()
    except Infeasible as exc:
        out = dataclasses.replace(refusal(exc.errors, _kind(calibration) if rates else "missing"),
                                  calibration_note=note, job=planner.job_summary(),
                                  smallest_gpu_memory_gib=planner.smallest_cap)
        return out, sweep_of
    finally:
        searched_s = time.perf_counter() - started
    if rates and not planner.rates:
        note = "the calibration lacks figures every route needs: memory fit only, no step times"
    plan = dataclasses.replace(
        plan,
        host_update=planner.rates.host_update_summary(plan.policy["delivery_cast"]) if planner.rates else None,
        calibration=_kind(calibration) if planner.rates else "missing",
        calibration_note=note,
        cast_scratch=planner.cast_scratch_choice(plan.policy),
    )
    return plan, sweep_of


def headroom_words(headroom: dict[str, Any]) -> str:
    """The headroom decision in one sentence (the plan's why, `slidedp plan`)."""
    margin, free = headroom["margin_fraction"], headroom["chosen_free_fraction"]
    if headroom["outcome"].startswith("took"):
        slower = headroom["slower_by_fraction"]
        by = f"{slower:.1%} slower than" if slower > 0 else "no slower than"
        return (f"Headroom: took a plan {by} the fastest found, leaving "
                f"{free:.1%} of the GPU memory budget free (the fastest left {headroom['fastest_free_fraction']:.1%}, "
                f"under the {margin:.0%} margin).")
    if headroom["fastest_free_fraction"] < margin:
        return (f"Headroom: the fastest plan leaves {free:.1%} of the GPU memory budget free, under the {margin:.0%} "
                f"margin, and no plan within {headroom['max_slower_fraction']:.0%} of its step time keeps the margin.")
    return ""


def _kind(calibration: dict[str, Any]) -> str:
    return "declared" if calibration.get("declared") else "measured"


def _declared(plan: Plan, topology: dict[str, Any]) -> Plan:
    """A plan for a declared host (planning/profiles.py) names the profile under "declared"; its activation sizes
    are counted, not measured."""
    if not topology.get("declared"):
        return plan
    job = plan.job
    if job is not None and plan.calibration == "declared":
        job = dataclasses.replace(job, activation_sizes="estimated (declared host)")
    return dataclasses.replace(plan, declared=topology["declared"], job=job)


# The fewest gradient staging slots a plan takes of itself (a job config may not ask for fewer either:
# policy.staging_slots is at least 4).
FEWEST_SLOTS = 4


class _Planner(RouteSearch, KnobSearch, StreamedSearch, PlanJson, MixSearch, Refusals):
    """One job's search: the job, its rates (None: memory only), the activation sizes and the settings the user
    fixed (`fixed`: the config's PolicyConfig.fixed(), the one answer to what the user fixed); the parts of the
    search come from the mixins, each in its module."""

    def __init__(self, cfg: Any, job: Job, rates: Rates | None, acts: ActivationSizes,
                 sims: dict[ExecutionPolicy, dict[str, Any]] | None = None, compiled: CompiledChoice | None = None,
                 fewer_slots: bool = False):
        self.cfg, self.job, self.rates, self.acts = cfg, job, rates, acts
        self.fewer_slots = fewer_slots  # staging_that_fits may take fewer staging slots than the default
        self.fixed = cfg.policy.fixed()
        # compiled_layers of every policy the search makes (planning/compiled_choice.py)
        self.compiled = compiled or choose_compiled(self.fixed, None, job.on_gpu)
        # predictions by policy; they do not depend on the HBM budget, so the card sweep's planners share them
        self.sims: dict[ExecutionPolicy, dict[str, Any]] = {} if sims is None else sims
        self.mems: dict[ExecutionPolicy, tuple[Rates | None, dict[str, Any]]] = {}  # mem's, with the rates used

    # ------------------------------------------------------------------ memory
    def mem(self, pol: ExecutionPolicy) -> dict[str, Any]:
        """The memory model's figures of the policy, once per policy while the rates stay (read, never changed)."""
        hit = self.mems.get(pol)
        if hit is None or hit[0] is not self.rates:
            hit = self.mems[pol] = (self.rates, memory(self.job, pol, self.acts,
                                                       offload_backlog(self.job, pol, self.rates)))
        return hit[1]

    def fits(self, pol: ExecutionPolicy) -> str | None:
        """None when the policy fits; else what does not, by how much."""
        m, j = self.mem(pol), self.job
        if j.on_gpu and m["hbm_peak_bytes"] > j.hbm_budget:
            return (
                f"needs {m['hbm_peak_bytes'] / GIB:.1f} GiB of HBM per GPU, "
                f"{(m['hbm_peak_bytes'] - j.hbm_budget) / GIB:.1f} GiB over the budget of {j.hbm_budget / GIB:.1f} GiB"
            )
        if m["host_bytes"] > j.host_limit_bytes:
            return (
                f"needs {m['host_bytes'] / GIB:.1f} GiB of host RAM, "
                f"{(m['host_bytes'] - j.host_limit_bytes) / GIB:.1f} GiB more than the {j.host_limit_bytes / GIB:.1f} GiB available"
            )
        return None

    # ------------------------------------------------------------------ time
    def simulated(self, pol: ExecutionPolicy) -> dict[str, Any]:
        """The cost model's prediction of the policy (without exposure), simulated once per policy."""
        if pol not in self.sims:
            self.sims[pol] = predict(self.job, pol, self.rates)
        return self.sims[pol]

    def time(self, pol: ExecutionPolicy) -> float:
        return self.simulated(pol)["step_time_s"]

    # ------------------------------------------------------------------ a policy from choices
    def fixed_mix(self) -> dict[str, int]:
        """Counts the user fixed: activations for every layer, keep/offload layer counts, resident layers."""
        L, u, out = self.job.layers, self.fixed, {}
        if "activations" in u:
            out.update(
                keep=L if u["activations"] == "keep" else 0, offload=L if u["activations"] == "offload" else 0
            )
        else:
            if "keep_layers" in u:
                out["keep"] = min(u["keep_layers"], L)
            if "offload_layers" in u:
                out["offload"] = min(u["offload_layers"], L - out.get("keep", 0))
        if "resident_units" in u:
            out["resident"] = min(u["resident_units"], L)
        return out

    def base(
        self,
        delivery: str,
        grad: str,
        window: int,
        chunk: int,
        loss_chunk: int,
        mix: dict[str, int],
        edge: str = "host",
        device_layers: int = 0,
        streamed_layers: int | None = None,
    ) -> ExecutionPolicy:
        """A policy of these choices with the user's fixed mix; streamed_layers None: as the config fixes it."""
        fixed = self.fixed_mix()
        streamed = self.fixed.get("streamed_layers", 0) if streamed_layers is None else streamed_layers
        n = {k: fixed.get(k, mix.get(k, 0)) for k in ("keep", "offload", "resident")}
        return self.staging_that_fits(ExecutionPolicy.mix(
            self.job.layers,
            n["keep"],
            n["offload"],
            n["resident"],
            delivery=delivery,
            grad_reduce=grad,
            delivery_cast=self.cfg.policy.delivery_cast,
            window=window,
            chunk_mb=chunk,
            loss_chunk_tokens=loss_chunk,
            edge_update=edge,
            device_layers=min(device_layers, self.job.layers),  # the config may ask for more than the model has
            staging_slots=self.fixed.get("staging_slots", 0),  # 0: the window's default, or the slot sweep's pick
            # at most the layers above the device layers (resolve's rule)
            streamed_layers=min(streamed, self.job.layers - min(device_layers, self.job.layers)),
            compiled_layers=self.compiled.compiled,
            post_norm_passes=self.fixed.get("post_norm_passes", 1),
            cast_scratch_mb=self.fixed.get("cast_scratch_mb", 0),
        ))

    def sweep_post_norm(self, pol: ExecutionPolicy) -> ExecutionPolicy:
        """With clipping: the chosen policy with its post-norm host update in one pass or in two, whichever is
        priced faster (the search before it priced one; the cost model prices two by the measured POST_NORM_PASS_SHARES, slower so far
        on every job). As fixed where the config fixes it; unchanged without clipping or rates."""
        if not (self.job.clip and self.rates) or "post_norm_passes" in self.fixed:
            return pol
        two = dataclasses.replace(pol, post_norm_passes=2)
        return two if self.time(two) < self.time(pol) else pol

    def fewest_staging(self, pol: ExecutionPolicy) -> ExecutionPolicy:
        """With fewer_slots, the policy with the fewest staging slots the planner would give it (its leanest in
        host RAM: FEWEST_SLOTS or window + 1); otherwise, or where the user fixed the count, the policy as it is."""
        if "staging_slots" in self.fixed or not self.job.on_gpu or not self.fewer_slots:
            return pol
        return dataclasses.replace(pol, staging_slots=min(pol.staging_slots, max(FEWEST_SLOTS, pol.window + 1)))

    def staging_that_fits(self, pol: ExecutionPolicy) -> ExecutionPolicy:
        """With fewer_slots (the second search of a job the first refused for host RAM), the policy with fewer
        gradient staging slots than the window's default where the default leaves the host short of RAM and fewer
        fit (each slot is the largest unit's gradient, page-locked, per rank: 2.3 GiB
        for Qwen3-8B's head): the most slots, down to FEWEST_SLOTS or window + 1, that fit. Fewer slots let the
        backward run less far ahead of the host update, which the step's pricing sees; a count the user fixed is
        kept, and where even the fewest do not fit the policy is returned as it was (its refusal says why)."""
        limit = self.job.host_limit_bytes
        lean = self.fewest_staging(pol)
        if lean == pol or self.mem(pol)["host_bytes"] <= limit:
            return pol
        low = self.mem(lean)["host_bytes"]
        if low > limit:
            return pol
        fewest = lean.staging_slots
        per_slot = (self.mem(pol)["host_bytes"] - low) / (pol.staging_slots - fewest)
        n = min(pol.staging_slots - 1, fewest + int((limit - low) // per_slot)) if per_slot > 0 else fewest
        return dataclasses.replace(pol, staging_slots=n)

    # ------------------------------------------------------------------ the search
    def run(self) -> Plan:
        """Refuse what cannot fit even at its leanest; without times, the topology's route; with them, the best
        route and mix at the default knobs, then the knobs around it; refuse a best that still does not fit."""
        start = self.start_knobs()
        self.check_minimum(start.window, start.chunk_mb, start.loss_chunks)
        if not self.rates:
            return self.memory_only(start.window, start.chunk_mb, start.loss_chunk_tokens)
        pol, marginal, candidates, untimed = self.choose(start)
        headroom = None
        if pol is not None:
            fastest = pol
            pol, headroom = self.keep_headroom(pol)
            if pol != fastest:
                candidates.append(self.candidate(pol))
        if pol is None:
            self.rates = None
            plan = self.memory_only(start.window, start.chunk_mb, start.loss_chunk_tokens)
            return plan.with_why("; ".join(untimed) + ".")
        if "activations" not in self.fixed and "keep_layers" not in self.fixed:
            every = dataclasses.replace(pol, activations=("keep",) * self.job.layers)
            if self.fits(every) is not None:
                candidates.append(self.candidate(every))  # shows why not every layer keeps its activations
        plan = self.result(pol, candidates, marginal)
        if headroom is not None:
            plan = dataclasses.replace(plan, headroom=headroom)
            if headroom_words(headroom):
                plan = plan.with_why(headroom_words(headroom))
        if untimed:
            plan = plan.with_why("Routes left out: " + "; ".join(untimed) + ".")
        return plan

    def choose(self, start: StartKnobs) -> tuple[ExecutionPolicy | None, dict | None, list[Candidate], list[str]]:
        """The timed search: the best route and mix at the start knobs, then the knobs around it. Returns the
        policy (None when no route could be priced), its marginal costs, the candidates weighed and the routes
        left out; refuses a best that still does not fit."""
        candidates, best, untimed = self.search_routes(start.window, start.chunk_mb, start.loss_chunk_tokens,
                                                          start.loss_chunks)
        if best is None:
            return None, None, candidates, untimed
        pol, marginal = best
        pol = self.sweep_knobs(pol, marginal, start.loss_chunks, candidates)
        pol, marginal = self.sweep_streamed(pol, marginal, candidates)
        pol = self.sweep_post_norm(pol)
        short = self.fits(pol)
        if short is not None:  # no route, mix or knob fits: never hand out an over-budget plan as feasible
            raise Infeasible([self.hbm_error(pol, self.mem(pol)) if "HBM" in short else {"loc": "model", "msg": short}])
        return pol, marginal, candidates, untimed

    def keep_headroom(self, pol: ExecutionPolicy) -> tuple[ExecutionPolicy, dict[str, Any] | None]:
        """HEADROOM_RULE applied to the search's fastest policy `pol`: where it leaves under HEADROOM_MARGIN of the
        GPU memory budget free, layers are moved a few at a time, each time the move that costs the least step
        time per byte it frees (the fewest kept layers checkpointed, resident layers streamed, or layers updated
        on the host instead of the GPUs, that lower the peak; never a count the user fixed), until the margin holds or the step is HEADROOM_SLOWER slower. Returns the policy and the decision (the
        plan's `headroom`); None for the decision without times or GPUs."""
        j = self.job
        if not (self.rates and j.on_gpu and j.hbm_budget):
            return pol, None

        def free(p: ExecutionPolicy) -> float:
            return 1 - self.mem(p)["hbm_peak_bytes"] / j.hbm_budget

        fastest_time, fastest_free, fixed = self.time(pol), free(pol), self.fixed_mix()
        limit = fastest_time * (1 + HEADROOM_SLOWER)
        here = pol
        while free(here) < HEADROOM_MARGIN and self.time(here) <= limit:
            n, peak, moves = self.counts(here), self.mem(here)["hbm_peak_bytes"], []
            n["device"] = here.device_layers
            for f in ("keep", "resident", "device"):
                # the fewest layers that free memory: the first resident layer streamed brings the window's
                # buffers back, so one alone can raise the peak
                mine = f not in fixed and not (f == "device" and "device_layers" in self.fixed)
                for fewer in range(1, n[f] + 1 if mine else 0):
                    trial = (dataclasses.replace(here, device_layers=n[f] - fewer) if f == "device"
                             else self.with_counts(here, {**n, f: n[f] - fewer}))
                    freed = peak - self.mem(trial)["hbm_peak_bytes"]
                    if freed > 0:
                        moves.append((max(self.time(trial) - self.time(here), 0.0) / freed, -freed, trial))
                        break
            if not moves:
                break
            here = min(moves, key=lambda m: m[:2])[2]
        if fastest_free >= HEADROOM_MARGIN:
            outcome = "fastest keeps the margin"
        elif free(here) >= HEADROOM_MARGIN and self.time(here) <= limit:
            outcome, pol = "took a plan that keeps the margin", here
        else:
            outcome = "fastest kept: no plan within the slowdown keeps the margin"
        return pol, {
            "margin_fraction": HEADROOM_MARGIN,
            "max_slower_fraction": HEADROOM_SLOWER,
            "chosen_free_fraction": free(pol),
            "fastest_free_fraction": fastest_free,
            "fastest_step_time_s": fastest_time,
            "slower_by_fraction": self.time(pol) / fastest_time - 1,
            "outcome": outcome,
            "rule": HEADROOM_RULE,
        }

    def best_at(self, job: Job) -> tuple[dict[str, Any], Prediction]:
        """The policy the same search chooses for `job` (this job with another memory per GPU) and its
        prediction, without the plan's write-up; Infeasible when nothing fits. The predictions made so far are
        shared, as they do not depend on the memory."""
        other = _Planner(self.cfg, job, self.rates, self.acts, self.sims, self.compiled, self.fewer_slots)
        start = other.start_knobs()
        other.check_minimum(start.window, start.chunk_mb, start.loss_chunks)
        pol = other.choose(start)[0] if other.rates else None
        if pol is not None:
            pol = other.keep_headroom(pol)[0]
        if pol is None:
            other.rates = None
            plan = other.memory_only(start.window, start.chunk_mb, start.loss_chunk_tokens)
            return plan.policy, plan.predicted
        return pol.to_dict(), other.predicted(pol)
