"""A bytecode cache for rank processes where the installed packages have none.

Each rank is a fresh Python process that imports torch, transformers and the engine before its first step. Where
those packages (or slidedp's own source tree) come without bytecode (`pip install --no-compile`, a read-only tree
copied in, an image built with byte-compiling off) and the interpreter cannot write it beside them, every import
compiles its module from source again: 5 s of a 2-core machine's time for a rank's imports and its model built on
the meta device against under 3 s with bytecode, and 12.6-13.5 s against 6.1-7.2 s on a GPU host
(`scripts/gpu_run.sh pyc`), paid by every rank of every job. There the ranks get a bytecode cache of their own
(PYTHONPYCACHEPREFIX, under the host's cache folder beside the calibrations, slidedp.cache_paths): the first job
fills it, later ones read it. The launcher's own environment is left as it is. Imports no torch.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from slidedp.cache_paths import calibration_dir

# What a rank imports before its first step that costs most to compile, and slidedp itself (run from a source tree
# that no process may write bytecode into, as on a machine the tree is copied to): the packages checked.
PACKAGES = ("torch", "transformers", "slidedp")
# A package counts as compiled when at least this share of the modules sampled from its top folder have bytecode.
_SAMPLE = 24


def bytecode_dir() -> str:
    """The ranks' bytecode cache: beside the calibrations, as the compiled kernels are."""
    return os.path.join(calibration_dir(), "bytecode")


def _compiled(origin: str) -> bool:
    """Whether the modules of the package whose __init__ is `origin` have bytecode where this interpreter reads
    it (beside them, or under PYTHONPYCACHEPREFIX when that is set): half of a sample at least."""
    folder = os.path.dirname(origin)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    except OSError:
        return True  # not a folder of sources (a zip import, a frozen package): nothing to say
    sample = [os.path.join(folder, n) for n in names[:_SAMPLE]]
    try:
        have = sum(os.path.exists(importlib.util.cache_from_source(p)) for p in sample)
    except NotImplementedError:  # no cache tag: this interpreter writes no bytecode anywhere
        return True
    return 2 * have >= len(sample)


@functools.lru_cache(maxsize=1)
def missing(packages: tuple[str, ...] = PACKAGES) -> tuple[str, ...]:
    """The packages (of `packages`, installed) whose modules this interpreter would compile from source."""
    out = []
    for name in packages:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
        if spec is not None and spec.origin and spec.origin.endswith(".py") and not _compiled(spec.origin):
            out.append(name)
    return tuple(out)


def rank_env_changes(env: dict[str, str]) -> dict[str, str | None]:
    """What a rank's environment changes so its imports read cached bytecode: {} where the packages have theirs,
    else PYTHONPYCACHEPREFIX set to bytecode_dir() and PYTHONDONTWRITEBYTECODE removed (None: unset), so the
    cache is written (into that folder only; the package trees are not touched). A prefix the environment
    sets already is kept."""
    if env.get("PYTHONPYCACHEPREFIX") or not missing():
        return {}
    return {"PYTHONPYCACHEPREFIX": bytecode_dir(), "PYTHONDONTWRITEBYTECODE": None}
