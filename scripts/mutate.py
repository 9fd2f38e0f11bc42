"""Mutation testing of the modules where a silent error costs users most: `make mutate` (or
`.venv/bin/python scripts/mutate.py [target ...]`, `--list` for the targets). Not part of `make test`: it is slow.

mutmut names a mutant by its file's path from where it runs, and the tests import `slidedp` and `slidedp_web`,
which live in runtime/ and backend/. So each target runs in its own folder, .mutate/<target>/, that lays the two
packages out at the top (links to the working tree) beside a link to tests/ and a pyproject.toml made here: the
[tool.mutmut] options of the real pyproject.toml, the target's files to mutate and the few test files that cover
it. Only lines those tests run are mutated (mutate_only_covered_lines): a target is a few functions of a module,
not all of it. The run ends with each target's counts and every survivor's diff (docs/testing.md says which
survivors are judged equivalent, and why).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutate"
MUTMUT = Path(sys.executable).with_name("mutmut")

# target: (files to mutate, as the package sees them; the tests that cover them). Each test selection runs in
# seconds, since every mutant runs the tests that reached its function.
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    "schedule": (["slidedp/step/optimizer.py"], [
        "tests/runtime/test_lr_schedule.py::test_the_decay_reaches_its_floor_as_torch_schedulers_do",
        "tests/runtime/test_lr_schedule.py::test_a_constant_schedule_ignores_the_floor",
    ]),
    "clip": (["slidedp/step/optimizer.py"], ["tests/runtime/test_clip_rule.py"]),
    "health": (["slidedp/health.py"], ["tests/runtime/test_health.py"]),
    "memory-cap": (["slidedp/planning/job.py", "slidedp/step/devices.py"], ["tests/runtime/test_gpu_memory_cap.py"]),
    "guards": (["slidedp_web/guards.py"], ["tests/backend/test_guards.py"]),
    "delete": (["slidedp_web/outputs.py"], ["tests/backend/test_delete_overlap.py"]),
    "export": (["slidedp/persist/export.py"], ["tests/runtime/test_export.py"]),
}
PACKAGES = {"slidedp": ROOT / "runtime" / "slidedp", "slidedp_web": ROOT / "backend" / "slidedp_web"}


def toml_value(value) -> str:
    return json.dumps(value)  # a TOML basic string, number, boolean or array of them reads the same as JSON


def prepare(name: str, files: list[str], tests: list[str]) -> Path:
    """The target's folder: the packages and tests linked in, and its pyproject.toml."""
    folder = WORK / name
    folder.mkdir(parents=True, exist_ok=True)
    for link, target in [*PACKAGES.items(), ("tests", ROOT / "tests")]:
        path = folder / link
        if not path.is_symlink():
            path.symlink_to(target, target_is_directory=True)
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)
    options = dict(project["tool"].get("mutmut", {}))
    options.update(source_paths=sorted({f.split("/")[0] for f in files}), only_mutate=files,
                   pytest_add_cli_args_test_selection=tests)
    pytest_options = dict(project["tool"]["pytest"]["ini_options"], pythonpath=["."])
    lines = ["[tool.mutmut]", *(f"{k} = {toml_value(v)}" for k, v in options.items()),
             "", "[tool.pytest.ini_options]", *(f"{k} = {toml_value(v)}" for k, v in pytest_options.items())]
    text = "\n".join(lines) + "\n"
    if not (folder / "pyproject.toml").exists() or (folder / "pyproject.toml").read_text() != text:
        (folder / "pyproject.toml").write_text(text)
    # mutmut keeps each mutant's outcome in mutants/ and does not run a survivor again when only the tests changed:
    # every run starts from no results, so a test written to kill a survivor is seen to kill it
    shutil.rmtree(folder / "mutants", ignore_errors=True)
    return folder


def survivors(folder: Path) -> tuple[dict[str, int], list[str]]:
    """Counts by outcome and the surviving mutants' names, from `mutmut results --all true`."""
    out = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=folder, capture_output=True, text=True)
    counts: dict[str, int] = {}
    alive = []
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if not m:
            continue
        counts[m.group(2)] = counts.get(m.group(2), 0) + 1
        if m.group(2) == "survived":
            alive.append(m.group(1))
    return counts, alive


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"some of: {', '.join(TARGETS)} (default: all)")
    ap.add_argument("--list", action="store_true", help="list the targets and their tests, run nothing")
    ap.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    args = ap.parse_args()
    if args.list:
        for name, (files, tests) in TARGETS.items():
            print(f"{name}: mutates {', '.join(files)}; tests {', '.join(tests)}")
        return 0
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; the targets are {', '.join(TARGETS)}")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    report = []
    for name in args.targets or list(TARGETS):
        files, tests = TARGETS[name]
        folder = prepare(name, files, tests)
        print(f"== mutate {name}: {', '.join(files)} against {len(tests)} test selection(s)", flush=True)
        run = subprocess.run([str(MUTMUT), "run", "--max-children", str(args.max_children)], cwd=folder, env=env)
        counts, alive = survivors(folder)
        report.append((name, run.returncode, counts, alive, folder))
    print("\n== mutation report (survivors: a change no selected test notices)")
    for name, rc, counts, alive, folder in report:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no mutants"
        print(f"{name}: {summary}" + (f" (mutmut exited {rc})" if rc else ""))
        for mutant in alive:
            diff = subprocess.run([str(MUTMUT), "show", mutant], cwd=folder, capture_output=True, text=True)
            changed = [ln for ln in diff.stdout.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
            print(f"  {mutant}\n    " + "\n    ".join(changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
