"""Guards: what the workbench refuses up front, with a clear answer, instead of failing late or going too far.

* **Roots.** Every path a job names goes through one check (root_errors): its model directory, its dataset and
  eval dataset, its output folder and an init_from checkpoint path. A path that cannot name a file (a NUL
  byte, a name over 255 bytes) is a 422 naming its key, always. With SLIDEDP_MODEL_ROOTS / SLIDEDP_DATA_ROOTS /
  SLIDEDP_OUTPUT_ROOTS set (colon-separated folders) each must also lie inside a root of its kind once every `..`
  and symlink is resolved (a relative output_dir is taken under the first output root); anything else is a 422
  naming `model`, `data.path`, `eval.path`, `output_dir` or `init_from.checkpoint`. The API reads what a job
  names (it validates the datasets, sizes the model), so a refused path is never opened: its contents cannot
  come back in an answer, and the refusal reads the same whether it exists, is a folder or is missing. Unset
  means unconfined, as on a laptop (a non-loopback `slidedp serve` sets them: slidedp_web/embedded.py). The job
  process checks again with its own worker's settings: the worker may be configured more tightly. The data
  folder is not exempt, except a job's own folder there, which the API picks when output_dir is left out. Who
  owns a folder is slidedp_web/outputs.py.
* **Request size.** Bodies above SLIDEDP_MAX_REQUEST_BYTES are refused with 413 before they are read (the API's
  middleware: slidedp_web/api/middleware.py).
* **Resources** (slidedp_web/preflight.py). Before the job process allocates anything it checks the job against its host as the worker
  reported it (host RAM and GPU memory, through AutoPolicy's memory model, which also covers fully explicit
  policies the runtime does not plan; the plan stored at submit time answers when it was made on that very
  report, so the job is not planned again for it) and against the free space of the shared-memory folder the
  host state is created in (Docker gives a container 64 MiB of /dev/shm unless told otherwise, and a host state
  that does not fit there dies with SIGBUS at first touch, long after the start). A refusal fails the job with
  the structured error {"message", "errors": [{"loc", "msg"}]}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

GIB = 2**30
DEMO_PREFIX = "demo:"  # datasets shipped with slidedp (slidedp.data.demo_paths), inside the installation
MAX_WALK_ENTRIES = 10_000  # a model directory holds tens of files; stop looking for escaping links after this


# ------------------------------------------------------------------------------------------------ roots
NAME_MAX = 255  # bytes in one file or folder name (Linux filesystems)
PATH_MAX = 4096  # bytes in a whole path, its terminating NUL included
SHOWN_CHARS = 80  # what an error quotes of a value the client sent; the client has the rest
SHOWN_PATH_CHARS = 240  # a path is quoted further, so that the folder it names can still be told apart


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A client's value as an error quotes it: repr of its first `limit` characters, '…' when there were more.

    An answer must not grow with the request (a 100 KB profile name repeated back) nor carry more of it than
    it takes to see which value is meant."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:limit] + "…") if len(text) > limit else repr(text)


def parse_roots(value: Optional[str]) -> list[Path]:
    """The folders of a colon-separated roots setting, resolved (symlinks included) once."""
    if not value:
        return []
    return [Path(os.path.realpath(os.path.expanduser(p.strip()))) for p in value.split(":") if p.strip()]


def _inside(path: Path, roots: list[Path]) -> bool:
    # By path components: a sibling sharing a root's prefix (/x/models2 beside /x/models) is outside.
    return any(path == root or path.is_relative_to(root) for root in roots)


def form_error(value: str) -> Optional[str]:
    """Why `value` cannot name a file on this host at all, judged on its text alone (nothing is looked up, so the
    answer is the same wherever it points), or None."""
    if "\x00" in value:
        return "holds a NUL byte, which no path may hold"
    try:
        raw = os.fsencode(os.path.expanduser(value))
    except (UnicodeError, ValueError):
        return "holds characters that cannot be written in a file name on this host"
    if len(raw) >= PATH_MAX:
        return f"is {len(raw)} bytes long; a path has at most {PATH_MAX - 1} bytes on this host: shorten it"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        return (
            f"holds a name of {longest} bytes; a file or folder name has at most {NAME_MAX} bytes on this host: "
            "shorten it"
        )
    return None


def _escaping_link(directory: Path, roots: list[Path]) -> Optional[Path]:
    """A symlink below `directory` whose target lies outside the roots, else None."""
    seen = 0
    # Links to folders are entered: a folder inside the roots may itself hold a link out. A loop of links ends
    # where the kernel stops resolving the path (ELOOP), and unreadable folders are skipped, as os.walk does.
    for top, dirs, files in os.walk(directory, followlinks=True):
        for name in dirs + files:
            seen += 1
            entry = Path(top) / name
            if os.path.islink(entry) and not _inside(Path(os.path.realpath(entry)), roots):
                return entry
            if seen >= MAX_WALK_ENTRIES:
                return None
    return None


def path_error(value: str, roots: list[Path], kind: str, setting: str) -> Optional[str]:
    """Why `value` (a `kind` path: model, dataset, output folder, checkpoint) may not be used under these roots,
    or None when it may.

    A refusal says the same whether the path exists, is a folder or a file, cannot be looked up (a loop of
    symlinks, a folder the server may not enter) or is missing, and never shows where its symlinks lead: the
    answer must not let a client map files outside the roots."""
    allowed = f"{':'.join(str(r) for r in roots)} ({setting})"
    refusal = (
        f"{shown(value, SHOWN_PATH_CHARS)} is not inside the folders allowed for {kind}s: {allowed}; paths are "
        f"judged after '~', '..' and symlinks are resolved. Put the {kind} in one of them, or ask the operator to "
        "add its folder."
    )
    try:
        real = Path(os.path.realpath(os.path.expanduser(value)))
        if not _inside(real, roots):
            return refusal
        link = _escaping_link(real, roots) if os.path.isdir(real) else None
    except (ValueError, OSError):  # a NUL byte, a name too long, a folder the server may not enter
        return refusal
    if link is not None:
        return (
            f"{shown(value, SHOWN_PATH_CHARS)} holds a symlink {shown(str(link.relative_to(real)))} that leads "
            f"outside the folders allowed for {kind}s ({allowed}). Copy the file into the {kind} directory instead."
        )
    return None


def config_paths(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(loc, value) of every path a job config names: the model directory (a preset names none), the dataset
    and the eval dataset (a shipped `demo:` dataset names none), the output folder, and an init_from checkpoint
    given as a path (with init_from.job it is the name of that job's checkpoint). Values that are not strings
    are left to the config's own validation."""
    from slidedp.config import is_model_path

    def text(value: Any) -> Optional[str]:
        return value if isinstance(value, str) and value else None

    found: list[tuple[str, str]] = []
    model = text(config.get("model"))
    if model is not None and ("\x00" in model or is_model_path(model)):
        found.append(("model", model))
    for section in ("data", "eval"):
        part = config.get(section)
        path = text(part.get("path")) if isinstance(part, dict) else None
        if path is not None and not path.startswith(DEMO_PREFIX):
            found.append((f"{section}.path", path))
    out = text(config.get("output_dir"))
    if out is not None:
        found.append(("output_dir", out))
    init = config.get("init_from")
    if isinstance(init, dict) and init.get("job") is None and text(init.get("checkpoint")) is not None:
        found.append(("init_from.checkpoint", init["checkpoint"]))
    return found


def root_errors(
    model_roots: Optional[str],
    data_roots: Optional[str],
    config: Any,
    output_roots: Optional[str] = None,
    data_dir: Optional[Path] = None,
) -> list[dict[str, str]]:
    """[{"loc", "msg"}] for every path of a job config (a raw request body or a stored config; config_paths)
    that cannot name a file at all (form_error: a NUL byte, a name over 255 bytes), or lies outside the roots of
    its kind: model -> model roots; data.path, eval.path -> data roots; output_dir and an init_from checkpoint
    path -> output roots (a relative output_dir is taken under the first, as slidedp_web.outputs.resolve does;
    a checkpoint may also lie in the jobs folder of `data_dir`, where the jobs' own folders are). [] when every
    path is well formed and no roots are set, or the paths are inside them. The data folder is not exempt:
    only a job's own folder there, which the API chooses when output_dir is left out, is never judged here.

    This is the one check of a job's paths: the API runs it before it reads anything a request names (a path
    it refuses is never opened, so its contents cannot come back in an answer), and the job process runs it
    again (preflight) with its worker's settings."""
    if not isinstance(config, dict):
        return []
    roots_of = {"model": parse_roots(model_roots), "data": parse_roots(data_roots), "output": parse_roots(output_roots)}
    checkpoint_roots = roots_of["output"] + (
        [Path(os.path.realpath(Path(data_dir) / "jobs"))] if roots_of["output"] and data_dir is not None else []
    )
    judged = {  # loc -> (roots, kind, setting)
        "model": (roots_of["model"], "model", "SLIDEDP_MODEL_ROOTS"),
        "data.path": (roots_of["data"], "dataset", "SLIDEDP_DATA_ROOTS"),
        "eval.path": (roots_of["data"], "dataset", "SLIDEDP_DATA_ROOTS"),
        "output_dir": (roots_of["output"], "output folder", "SLIDEDP_OUTPUT_ROOTS"),
        "init_from.checkpoint": (checkpoint_roots, "checkpoint", "SLIDEDP_OUTPUT_ROOTS"),
    }
    errors = []
    for loc, value in config_paths(config):
        bad_form = form_error(value)
        if bad_form:
            errors.append({"loc": loc, "msg": f"{shown(value, SHOWN_PATH_CHARS)} {bad_form}"})
            continue
        roots, kind, setting = judged[loc]
        if not roots:
            continue
        target = Path(os.path.expanduser(value))
        if loc == "output_dir" and not target.is_absolute():
            target = roots[0] / target
        msg = path_error(str(target) if loc == "output_dir" else value, roots, kind, setting)
        if msg:
            errors.append({"loc": loc, "msg": msg})
    return errors


# ------------------------------------------------------------------------------------------- host RAM
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
