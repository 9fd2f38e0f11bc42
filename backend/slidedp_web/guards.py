"""Guards: what the workbench refuses up front, with a clear answer, instead of failing late or going too far.

* **Roots.** With SLIDEDP_MODEL_ROOTS / SLIDEDP_DATA_ROOTS set (colon-separated folders), a job's model directory
  and dataset file must lie inside one of them once every `..` and symlink is resolved; anything else is a 422
  naming `model` or `data.path`. The API reads what a job names (it validates the dataset, sizes the model), so
  without roots any file the server can read could be probed through it. Unset means unconfined, as on a laptop.
  The job process checks again with its own worker's settings: the worker may be configured more tightly.
  SLIDEDP_OUTPUT_ROOTS does the same for a job's `output_dir` (a relative one is taken under the first root);
  the data folder is not exempt, except a job's own folder there, which the API picks when output_dir is left
  out. A refusal reads the same whether or not the path exists. Who owns a folder is slidedp_web/outputs.py.
* **Request size.** Bodies above SLIDEDP_MAX_REQUEST_BYTES are refused with 413 before they are read; a job config
  is a few kilobytes, and nothing else is uploaded.
* **Resources.** Before the job process allocates anything it checks the job against its host as the worker
  reported it (host RAM and GPU memory, through AutoPolicy's memory model, which also covers fully explicit
  policies the runtime does not plan; the plan stored at submit time answers when it was made on that very
  report, so the job is not planned again for it) and against the free space of the shared-memory folder the
  host state is created in (Docker gives a container 64 MiB of /dev/shm unless told otherwise, and a host state
  that does not fit there dies with SIGBUS at first touch, long after the start). A refusal fails the job with
  the structured error {"message", "errors": [{"loc", "msg"}]}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

GIB = 2**30
DEMO_PREFIX = "demo:"  # datasets shipped with slidedp (slidedp.data.demo_paths), inside the installation
MAX_WALK_ENTRIES = 10_000  # a model directory holds tens of files; stop looking for escaping links after this


# ------------------------------------------------------------------------------------------------ roots
def parse_roots(value: Optional[str]) -> list[Path]:
    """The folders of a colon-separated roots setting, resolved (symlinks included) once."""
    if not value:
        return []
    return [Path(os.path.realpath(os.path.expanduser(p.strip()))) for p in value.split(":") if p.strip()]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _escaping_link(directory: Path, roots: list[Path]) -> Optional[tuple[Path, Path]]:
    """A symlink below `directory` whose target lies outside the roots: (link, target), else None."""
    seen = 0
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            seen += 1
            entry = Path(top) / name
            if entry.is_symlink():
                target = Path(os.path.realpath(entry))
                if not _inside(target, roots):
                    return entry, target
            if seen >= MAX_WALK_ENTRIES:
                return None
    return None


def path_error(value: str, roots: list[Path], kind: str, setting: str) -> Optional[str]:
    """Why `value` (a `kind` path: model or dataset) may not be used under these roots, or None when it may.

    A refusal says the same whether or not the path exists and never shows where its symlinks lead: the
    answer must not let a client map files outside the roots."""
    allowed = f"{':'.join(str(r) for r in roots)} ({setting})"
    refusal = (
        f"{value!r} is not inside the folders allowed for {kind}s: {allowed}; paths are judged after "
        f"'~', '..' and symlinks are resolved. Put the {kind} in one of them, or ask the operator to add "
        "its folder."
    )
    try:
        real = Path(os.path.realpath(os.path.expanduser(value)))
    except (ValueError, OSError):  # a NUL byte, a loop of symlinks
        return refusal
    if not _inside(real, roots):
        return refusal
    if real.is_dir():
        escape = _escaping_link(real, roots)
        if escape is not None:
            link, _target = escape
            return (
                f"{value!r} holds a symlink {str(link)!r} that leads outside the folders allowed for {kind}s "
                f"({allowed}). Copy the file into the {kind} directory instead."
            )
    return None


def root_errors(
    model_roots: Optional[str],
    data_roots: Optional[str],
    config: Any,
    output_roots: Optional[str] = None,
    data_dir: Optional[Path] = None,
) -> list[dict[str, str]]:
    """[{"loc", "msg"}] for a job config (a raw request body or a stored config) whose model, dataset or output
    folder lies outside the configured roots; [] when no roots are set or the paths are inside them. A relative
    output_dir is taken under the first output root (slidedp_web.outputs.resolve). The data folder is not
    exempt: only a job's own folder there, which the API chooses when output_dir is left out, is never judged
    here. Values that are not strings are left to the config's own validation."""
    if not isinstance(config, dict):
        return []
    from slidedp.config import is_model_path

    errors = []
    roots = parse_roots(model_roots)
    model = config.get("model")
    if roots and isinstance(model, str) and model and is_model_path(model):
        msg = path_error(model, roots, "model", "SLIDEDP_MODEL_ROOTS")
        if msg:
            errors.append({"loc": "model", "msg": msg})
    roots = parse_roots(data_roots)
    data = config.get("data")
    path = data.get("path") if isinstance(data, dict) else None
    if roots and isinstance(path, str) and path and not path.startswith(DEMO_PREFIX):
        msg = path_error(path, roots, "dataset", "SLIDEDP_DATA_ROOTS")
        if msg:
            errors.append({"loc": "data.path", "msg": msg})
    roots = parse_roots(output_roots)
    out = config.get("output_dir")
    if roots and isinstance(out, str) and out and "\x00" not in out:
        target = Path(os.path.expanduser(out))
        if not target.is_absolute():
            target = roots[0] / target
        msg = path_error(str(target), roots, "output folder", "SLIDEDP_OUTPUT_ROOTS")
        if msg:
            errors.append({"loc": "output_dir", "msg": msg})
    return errors


def check_roots(settings: Any, body: Any) -> None:
    """Raise the API's 422 when the request names a model or dataset outside the configured roots."""
    errors = root_errors(
        settings.model_roots, settings.data_roots, body, settings.output_roots, settings.data_dir
    )
    if errors:
        from slidedp_web.job_schema import unprocessable

        raise unprocessable(errors)


# ----------------------------------------------------------------------------------------- request size
class RequestSizeLimit:
    """ASGI middleware: 413 for a request body larger than `max_bytes`.

    A declared Content-Length is refused before anything is read; a chunked body is counted as it arrives and
    refused as soon as it passes the limit (the route reading it gets the 413 instead of the body)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, int(max_bytes)

    def detail(self, size: Optional[int]) -> str:
        got = f"{size} bytes" if size is not None else f"more than {self.max_bytes} bytes"
        return (
            f"request body too large: {got}, at most {self.max_bytes} bytes are accepted "
            "(SLIDEDP_MAX_REQUEST_BYTES). A job config is a few kilobytes: send the config, and name the model "
            "and dataset by their paths on the worker host."
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
        if declared is not None and declared > self.max_bytes:
            await _json_response(send, 413, {"detail": self.detail(declared)})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    from fastapi import HTTPException

                    raise HTTPException(413, self.detail(None))
            return message

        await self.app(scope, counted, send)


async def _json_response(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


# -------------------------------------------------------------------------------------------- resources
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

    from slidedp_web.outputs import default_folder, real

    judged = config.to_dict() if isinstance(config, JobConfig) else config
    if (
        job_id is not None
        and isinstance(judged.get("output_dir"), str)
        and real(judged["output_dir"]) == default_folder(settings, job_id)
    ):
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


def host_ram_error(cfg: Any, detected: Optional[int]) -> Optional[dict[str, str]]:
    """A job's host_ram_gib may lower the host's RAM limit (to leave room for other work), never raise it: the
    limit is what keeps a host state the machine cannot hold from being started."""
    if cfg.host_ram_gib is None or detected is None or cfg.host_ram_gib * GIB <= detected:
        return None
    return {
        "loc": "host_ram_gib",
        "msg": f"{cfg.host_ram_gib:g} GiB is more than this host's limit of {detected / GIB:.1f} GiB; host_ram_gib "
        "may only lower the limit: leave it out, or give at most that",
    }


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
