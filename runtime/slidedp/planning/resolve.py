"""The execution policy a run uses: AutoPolicy's plan where the config leaves a choice `auto`, the config where it
fixes one; a plan stored with the job (the web service's, made at submission) reused when it was made on what this
run sees. The host is detected on a thread of its own (detect_early) while the launcher reads the model's config.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from slidedp.config import ConfigError, JobConfig
from slidedp.policy import ExecutionPolicy, resolve

if TYPE_CHECKING:
    from slidedp.planning.cast_process import CastProcess
    from slidedp.startup import Startup

log = logging.getLogger(__name__)
# What measuring the host may fail with: its queries and calibration processes (RuntimeError is what a failed
# calibration, and torch, raise), files of the calibration cache. Nothing else falls back to the configured policy.
MEASUREMENT_ERRORS = (OSError, RuntimeError, subprocess.SubprocessError)


def _say(on_log: Callable[[str], None] | None, line: str) -> None:
    if on_log is not None:
        on_log(line)


# The choices a config must fix for its run to need no plan (staging_slots and the tuned knobs have defaults of
# their own without one).
ROUTE_CHOICES = ("delivery", "grad_reduce", "activations", "edge_update", "device_layers", "resident_units",
                 "delivery_cast")


def plans(cfg: JobConfig, predict_explicit: bool = False) -> bool:
    """Whether resolve_policy asks the planner: some choice is left to it (PolicyConfig.fixed, the one answer to
    what the user fixed), or predict_explicit wants an explicit policy predicted too (`slidedp bench` puts the
    prediction beside each measured row)."""
    fixed = cfg.policy.fixed()
    return predict_explicit or not all(name in fixed for name in ROUTE_CHOICES)


def detect_early(cfg: JobConfig, predict_explicit: bool = False) -> Future | None:
    """This host's topology (slidedp.planning.topology.detect), detected on a thread of its own so that its
    nvidia-smi and /sys reads run while the caller reads the model's config (importing transformers); None when
    resolve_policy will not plan. An error comes out of the future's result()."""
    if not plans(cfg, predict_explicit):
        return None
    from slidedp.planning import topology

    pool = ThreadPoolExecutor(1, thread_name_prefix="slidedp-detect")
    try:
        return pool.submit(topology.detect, cfg.host_ram_gib)
    finally:
        pool.shutdown(wait=False)  # the detection runs on; nothing else is submitted


def early_cast_process(cfg: JobConfig, predict_explicit: bool = False,
                       plan: dict | None = None) -> CastProcess | None:
    """A planning process for the host cast (planning/cast_process.py), started now so that its interpreter and
    imports overlap the request's checks and the host's detection; None where resolve_policy will not plan, where
    a plan came with the job (the web service's: reused unless the host changed), or where the job's plan has
    one cast to search. The caller closes it (resolve_policy does once it planned)."""
    from slidedp.planning import cast_process
    from slidedp.planning.autopolicy import searches_both_casts

    if plan is not None or not plans(cfg, predict_explicit) or not searches_both_casts(cfg):
        return None
    return cast_process.CastProcess()


def resolve_policy(cfg: JobConfig, num_layers: int, on_log=None, plan: dict | None = None,
                   startup: Startup | None = None, detected: Future | None = None,
                   predict_explicit: bool = False,
                   measured: Callable[[], None] | None = None,
                   beside: CastProcess | None = None) -> tuple[ExecutionPolicy, dict]:
    """The execution policy, resolved once (slidedp.policy.resolve): AutoPolicy's plan where the config says
    `auto`, the config where it fixes a choice. Returns (policy, plan); plan is {} when nothing was planned, and
    {"fallback": {"reason", "policy"}} when the host could not be measured (MEASUREMENT_ERRORS: logged, and the
    configured policy runs); an error of the planner itself is raised.

    `plan`: a plan made earlier for this job (the web service's, made when the job was submitted). It is used as it
    is when its basis (autopolicy.plan_basis) equals the basis of the topology and calibration this run sees;
    otherwise the job is planned again, one log line says why, and the new plan carries it under "replanned".

    `detected`: the topology being detected already (detect_early), waited for here instead of detecting again.
    predict_explicit: plan a config that leaves no choice `auto` too, for the prediction (plans).
    measured: called once nothing this call does measures the host any more (the topology detected and the
    calibration loaded or made; at once when it does not plan): train() spawns the ranks there, so their start
    overlaps the planning but never a calibration's timings.
    beside: early_cast_process's, given the host cast's search where this call plans (autopolicy.plan_for), and
    closed before this returns or raises."""
    try:
        return _resolve(cfg, num_layers, on_log, plan, startup, detected, predict_explicit, measured, beside)
    finally:
        if beside is not None:
            beside.close()


def _resolve(cfg: JobConfig, num_layers: int, on_log, plan: dict | None, startup: Startup | None,
             detected: Future | None, predict_explicit: bool, measured: Callable[[], None] | None,
             beside: CastProcess | None) -> tuple[ExecutionPolicy, dict]:
    p = cfg.policy
    stored, plan = plan, {}
    if plans(cfg, predict_explicit):
        from slidedp.planning import autopolicy, topology

        try:
            topo = detected.result() if detected is not None else topology.detect(cfg.host_ram_gib)
            _mark(startup, "detecting_host")
            from slidedp.planning import calibration as calib  # CPU jobs too: cached per host and shape

            calibration = calib.load_or_calibrate(
                cfg, topo, on_log=startup.calibration_log(on_log) if startup is not None else on_log)
            _mark(startup, "calibration")
        except MEASUREMENT_ERRORS as exc:
            # The host could not be measured (a GPU query or a calibration process failed, a cache folder is not
            # writable): the run goes on with the configured policy, and says so where a user looks.
            topo = None
            plan = {"fallback": {"reason": f"{type(exc).__name__}: {exc}", "policy": "configured"}}
            log.warning("planner unavailable, running the configured policy: %s", plan["fallback"]["reason"])
            _say(on_log, f"planner unavailable ({plan['fallback']['reason']}); using the configured policy")
        if measured is not None:
            measured()
        if topo is not None:
            # Past the measurements every error is the planner's own and is raised: a plan silently replaced by
            # the configured policy hides the bug and changes what the job runs.
            why = None if stored is None else _stale_plan(stored, autopolicy.plan_basis(cfg, topo, calibration),
                                                          cfg.world_size, num_layers)
            if stored is not None and why is None:
                plan = dict(stored)
                _say(on_log, "plan reused: this host and calibration are the ones it was made on")
            else:
                plan = autopolicy.plan_job(cfg, topo, calibration, beside=beside)
                if why is not None:
                    plan["replanned"] = why
                    _say(on_log, f"re-planned: {why}")
        _mark(startup, "plan")
        if plan and not plan.get("feasible", True):
            raise ConfigError(plan.get("errors") or [{"loc": "policy", "msg": "the job does not fit this host"}])
    elif measured is not None:
        measured()
    planned = ExecutionPolicy.from_dict(plan["policy"]) if plan.get("policy") else None
    policy = resolve(p, num_layers, cfg.world_size, planned)
    if "fallback" in plan:
        plan["fallback"]["policy"] = policy.to_dict()  # what ran instead of a plan, in the plan record
    return policy, plan


def _mark(startup: Startup | None, part: str) -> None:
    if startup is not None:
        startup.mark(part)


def _stale_plan(stored: Any, basis: dict, world: int, layers: int) -> str | None:
    """Why a stored plan may not be used by this run (None: it may): its basis is not this run's, or it was made
    for another world size or model depth."""
    from slidedp.planning.autopolicy import basis_change

    if not isinstance(stored, dict):
        return "the stored plan has no basis"
    why = basis_change(stored.get("basis"), basis)
    if why is not None:
        return why
    job = stored.get("job") if isinstance(stored.get("job"), dict) else {}
    if job.get("world", world) != world or job.get("layers", layers) != layers:
        return (f"the stored plan is for {job.get('world')} rank(s) and {job.get('layers')} layers, this run has "
                f"{world} and {layers}")
    if stored.get("feasible", True) and not isinstance(stored.get("policy"), dict):
        return "the stored plan holds no policy"
    return None
