"""The job process's checks before it starts training: the job's paths against its worker's roots (guards.py),
then its host RAM, GPU memory and shared-memory room on the worker's host as that worker reported it.

Docker gives a container 64 MiB of /dev/shm unless told otherwise, and a host state that does not fit there dies
with SIGBUS at first touch, long after the start; a refusal here fails the job at once with the structured error
{"message", "errors": [{"loc", "msg"}]}.
"""

from __future__ import annotations

from typing import Any, Optional

from slidedp_web.guards import GIB, form_error, host_ram_error, root_errors
from slidedp_web.outputs import default_folder, real


def shared_state_bytes(cfg: Any) -> int:
    """Bytes the job's host state takes in shared memory: fp32 master weights and AdamW moments (12 B/param),
    the bf16 delivery copy where one is made (2 B/param), and the gradient staging buffers."""
    from slidedp.host_memory import host_state_bytes
    from slidedp.presets import model_config_dict

    state, staging = host_state_bytes(cfg, model_config_dict(cfg.model))
    return state + staging


def planned_on(plan: Optional[dict[str, Any]], cfg: Any, topology: Optional[dict[str, Any]]) -> bool:
    """Whether a stored plan (docs/interfaces.md §5) was made on this topology: its basis's topology digest is the
    one the topology gives now (slidedp.planning.autopolicy.plan_basis)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("basis"), dict) or topology is None:
        return False
    from slidedp.planning.autopolicy import plan_basis

    return plan["basis"].get("topology") == plan_basis(cfg, topology, None)["topology"]


def resource_errors(
    cfg: Any, topology: Optional[dict[str, Any]], shm_directory: str, plan: Optional[dict[str, Any]] = None
) -> list[dict[str, str]]:
    """Host RAM and HBM (AutoPolicy's memory model against the host's topology; None: unknown, left to the runtime)
    and the shared-memory folder's free space, for a parsed JobConfig; [] when the job fits. A stored `plan` made
    on this very topology answers the memory question as it is; otherwise the job is planned for it here."""
    if topology is None:
        plan = {}
    elif not planned_on(plan, cfg, topology):
        from slidedp.planning.autopolicy import plan_job

        plan = plan_job(cfg, topology, None)
    if not plan.get("feasible", True):
        return [{"loc": str(e.get("loc", "model")), "msg": str(e.get("msg", ""))} for e in plan.get("errors") or []]
    try:
        need = shared_state_bytes(cfg)
    except (OSError, KeyError, ValueError, TypeError):
        return []  # a model that cannot be sized is reported by the runtime's own validation
    from slidedp.host_memory import free_bytes

    free = free_bytes(shm_directory)
    if free is not None and need > free:
        return [
            {
                "loc": "model",
                "msg": f"shared memory too small: the host state needs {need / GIB:.2f} GiB in {shm_directory} "
                f"but only {free / GIB:.2f} GiB is free there; in Docker give the worker a larger shm_size "
                "(or ipc: host), elsewhere free or enlarge that tmpfs (SLIDEDP_SHM_DIR names another folder)",
            }
        ]
    return []


def preflight(
    settings: Any,
    config: Any,
    topology: Optional[dict[str, Any]],
    job_id: Optional[int] = None,
    plan: Optional[dict[str, Any]] = None,
) -> list[dict[str, str]]:
    """Everything the job process checks before it starts training: roots, then resources. [] = go.

    config: the job's parsed JobConfig (a config dict is parsed here, and its errors are the answer); plan: the
    job's stored plan, which answers the memory check when it was made on this topology."""
    from slidedp.config import ConfigError, JobConfig

    judged = config.to_dict() if isinstance(config, JobConfig) else config
    out = judged.get("output_dir") if isinstance(judged, dict) else None
    if job_id is not None and isinstance(out, str) and form_error(out) is None:
        try:
            own = real(out) == default_folder(settings, job_id)
        except (OSError, ValueError):
            own = False
        if own:
            judged = {k: v for k, v in judged.items() if k != "output_dir"}  # the job's own folder
    errors = root_errors(
        settings.model_roots, settings.data_roots, judged, settings.output_roots, settings.data_dir
    )
    if errors:
        return errors
    try:
        cfg = config if isinstance(config, JobConfig) else JobConfig.from_dict(config)
    except ConfigError as exc:
        return list(exc.errors)
    from slidedp_web.hosts import basic_topology, host_ram_bytes

    if topology is None or not topology.get("gpus") and "basic probe" in str(topology.get("source", "")):
        # No detector report for this host: its RAM is known here, its GPUs are not. A GPU job is left to the
        # runtime, which counts the GPUs itself before it allocates anything.
        topology = None if cfg.gpus > 0 else basic_topology(settings)
    raised = host_ram_error(cfg, host_ram_bytes(topology or basic_topology(settings)))
    if raised:
        return [raised]
    from slidedp.step.host_state import shm_dir

    return resource_errors(cfg, topology, shm_dir(), plan)


def refusal(settings: Any, errors: list[dict[str, str]]) -> dict[str, Any]:
    """The job error a refusal before start fails a job with: {"message", "errors"}."""
    reasons = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
    return {"message": f"refused before start on {settings.host_name}: {reasons}", "errors": errors}


def job_refusal(
    settings: Any, cfg: Any, job_id: Optional[int] = None, plan: Optional[dict[str, Any]] = None
) -> Optional[dict[str, Any]]:
    """The job error to fail a job with before it starts on this worker's host, or None when it may start.

    cfg: the job's parsed JobConfig; plan: its stored plan (the API's, made at submit time), which answers the
    memory check without planning again when it was made on the host's reported topology.

    The host is taken as its worker reported it (hosts table: GPUs, HBM, the host RAM a job may use, with
    SLIDEDP_HOST_RAM_GIB applied), which is what the API planned the job against when it was submitted; the
    check is repeated here because the report may have changed since, and because the job may have been
    queued before any worker reported.
    """
    from slidedp_web.core.db import read_session
    from slidedp_web.models import Host

    with read_session(settings) as session:
        host = session.get(Host, settings.host_name)
        topology = host.topology if host is not None and host.topology else None
    errors = preflight(settings, cfg, topology, job_id, plan)
    return refusal(settings, errors) if errors else None
