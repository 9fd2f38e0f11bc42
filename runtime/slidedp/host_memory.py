"""Host memory: the RAM a job may use (configured, the cgroup limit, else MemTotal), the free space of the
shared-memory folder, and the host state a job's config needs at least (the least demanding policy it allows,
sized by slidedp.step.layout), with the error that refuses a job whose state cannot fit.

The cgroup or configured figure is preferred because MemTotal is not a limit everywhere: on the GPU machine it
starts small and grows as memory is touched, so it understates what a job may use. Imports no torch.
"""

from __future__ import annotations

import os
from typing import Any

from slidedp.config import JobConfig
from slidedp.presets import param_count, unit_param_counts

GIB = 2**30
_NO_LIMIT = 2**60  # cgroup v1 writes ~2**63 for "no limit"


def host_ram_limit(
    configured_gib: float | None = None, cgroup_root: str = "/sys/fs/cgroup"
) -> tuple[int, str]:
    """Host RAM a job may use, and where the figure comes from: the configured figure, else the cgroup memory
    limit, else MemTotal."""
    if configured_gib is not None:  # JobConfig bounds it (at most 1 PiB), so the product is finite
        return int(configured_gib * GIB), "host_ram_gib"
    limit = cgroup_memory_limit(cgroup_root)
    if limit is not None:
        return limit, "cgroup memory limit"
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "MemTotal"
    raise OSError("/proc/meminfo has no MemTotal line")


def cgroup_memory_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The tightest real memory limit of this process's cgroup (v2 memory.max or v1 memory.limit_in_bytes)."""
    v2_paths, v1_paths = [""], [""]
    try:
        with open(proc_cgroup, encoding="ascii") as fh:
            for line in fh:
                parts = line.strip().split(":", 2)
                if len(parts) != 3:
                    continue
                if parts[0] == "0" and parts[1] == "":
                    v2_paths.insert(0, parts[2].lstrip("/"))
                elif "memory" in parts[1].split(","):
                    v1_paths.insert(0, parts[2].lstrip("/"))
    except OSError:
        pass
    candidates = [os.path.join(root, p, "memory.max") for p in v2_paths]
    candidates += [os.path.join(root, "unified", p, "memory.max") for p in v2_paths]
    candidates += [os.path.join(root, "memory", p, "memory.limit_in_bytes") for p in v1_paths]
    limits = []
    for path in candidates:
        try:
            with open(path, encoding="ascii") as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < _NO_LIMIT:
            limits.append(int(value))
    return min(limits) if limits else None


def free_bytes(directory: str) -> int | None:
    """Free space of a folder, as the shared-memory segments of a host state would find it (None: unreadable)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def host_state_bytes(cfg: JobConfig, model_cfg: dict[str, Any]) -> tuple[int, int]:
    """(host state bytes, gradient staging and held-gradient bytes) for the job's model and ranks: the shared-memory
    layout (slidedp.step.layout, the rule the engine lays it out by) of the least demanding policy the config
    allows, so that a refusal here holds whatever AutoPolicy chooses (the plan then checks its own choice)."""
    import dataclasses

    from slidedp.policy import resolve
    from slidedp.step.layout import plan_layout

    units = unit_param_counts(model_cfg)
    layers, world = len(units) - 2, cfg.world_size
    base = resolve(cfg.policy, layers, world, None)
    options = [base]
    fixed = cfg.policy.fixed()  # what the user fixed; the rest is AutoPolicy's to choose
    if "edge_update" not in fixed:  # the embedding and head updated on the GPUs stage no gradient
        options.append(dataclasses.replace(base, edge_update="gpu", grad_reduce="gpu").for_world(world))
    # the cast on the GPUs keeps no bf16 copy on the host; auto takes it only where it casts bf16 on GPUs (in fp32
    # or on the CPU auto is the host cast, whose copy the layout then counts)
    if "delivery_cast" not in fixed and cfg.precision == "bf16" and cfg.gpus > 0:
        options += [dataclasses.replace(pol, delivery_cast="gpu") for pol in options]
    clip = cfg.optimizer.max_grad_norm > 0
    parts = min((plan_layout(units, world, pol, cfg.precision, clip, directory="", grad_accum=cfg.grad_accum).parts()
                 for pol in options), key=lambda p: sum(p.values()))
    return parts["master_and_moments"] + parts["delivery_copy"], parts["gradient_staging"] + parts["held_gradient"]


def check_host_ram(
    cfg: JobConfig, model_cfg: dict[str, Any], host_ram_bytes: int | None, errors: list[dict[str, str]]
) -> None:
    try:
        state, staging = host_state_bytes(cfg, model_cfg)
        params = param_count(model_cfg)
    except (KeyError, TypeError) as exc:
        errors.append({"loc": "model", "msg": f"the model config lacks {exc} needed to size the host state"})
        return
    if host_ram_bytes is not None:
        available, source = host_ram_bytes, "as given"
    else:
        available, source = host_ram_limit(cfg.host_ram_gib)
    need = state + staging
    if need > available:
        errors.append(
            {
                "loc": "host_ram_gib" if cfg.host_ram_gib is not None else "model",
                "msg": f"host RAM too small: the host state needs {need / GIB:.1f} GiB "
                f"({params / 1e9:.2f}B params x {state // params} B = {state / GIB:.1f} GiB, plus "
                f"{staging / GIB:.1f} GiB of gradient staging for {cfg.world_size} rank(s)) but "
                f"{available / GIB:.1f} GiB is available ({source}); use a smaller model, fewer ranks or a "
                "host with more memory",
            }
        )
