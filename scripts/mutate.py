"""Mutation testing of the modules where a silent error costs users most: `make mutate` (or
`.venv/bin/python scripts/mutate.py [target ...]`, `--list` for the targets). Not part of `make test`: it is slow.

mutmut names a mutant by its file's path from where it runs, and the tests import `slidedp` and `slidedp_web`,
which live in runtime/ and backend/. So each target runs in its own folder, .mutate/<target>/, that lays the two
packages out at the top (links to the working tree) beside links to tests/ and docs/ and a pyproject.toml made
here: the [tool.mutmut] options of the real pyproject.toml, the target's files to mutate and the few test files
that cover it. Only lines those tests run are mutated (mutate_only_covered_lines): a target is a few functions of
a module, not all of it, and a target's scope may narrow it to named functions. Mutants run one at a time unless
--max-children says otherwise. The run ends with each target's counts and every survivor's diff (docs/testing.md
says which survivors are judged equivalent, and why).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutate"
MUTMUT = Path(sys.executable).with_name("mutmut")

@dataclass(frozen=True)
class Target:
    """What one target mutates and which tests must notice.

    files: the modules to mutate, as the package sees them. tests: the test selections that cover them; each runs
    in seconds, since every mutant runs the tests that reached its function. scope: mutmut's names of the
    functions whose mutants are run (fnmatch patterns, `slidedp.planning.job.x_cap_budget*`), where a module's
    other functions are not what the target is about; empty: every covered function of the files."""

    files: list[str]
    tests: list[str]
    scope: list[str] = field(default_factory=list)


TARGETS: dict[str, Target] = {
    "schedule": Target(["slidedp/step/optimizer.py"], [
        "tests/runtime/test_lr_schedule.py::test_the_decay_reaches_its_floor_as_torch_schedulers_do",
        "tests/runtime/test_lr_schedule.py::test_a_constant_schedule_ignores_the_floor",
    ]),
    "clip": Target(["slidedp/step/optimizer.py"], ["tests/runtime/test_clip_rule.py"]),
    "health": Target(["slidedp/health.py"], ["tests/runtime/test_health.py"]),
    # the cap arithmetic: the planner's budget under a cap, the smallest cap a refusal names, the allocator's share
    # (apply_memory_cap runs on CUDA only: no quick test covers it, so it has no mutants on a CPU host)
    "memory-cap": Target(
        ["slidedp/planning/job.py", "slidedp/step/devices.py"],
        ["tests/runtime/test_gpu_memory_cap.py"],
        [
            "slidedp.planning.job.x_cap_budget__mutmut_*",
            "slidedp.planning.job.x_smallest_cap_gib__mutmut_*",
            "slidedp.step.devices.x_allocator_fraction__mutmut_*",
            "slidedp.step.devices.x_apply_memory_cap__mutmut_*",
        ],
    ),
    # in-process tests only: the API tests of the same refusals start a server and Redis per module
    "guards": Target(["slidedp_web/guards.py"], [
        "tests/backend/test_guards_roots.py",
        "tests/backend/test_guards.py::test_output_roots_take_relative_dirs_under_the_first_root",
        "tests/backend/test_guards.py::test_without_roots_any_readable_path_is_accepted_and_demo_data_always_is",
        "tests/backend/test_path_confinement.py::test_root_errors_compare_roots_by_path_components",
    ]),
    "delete": Target(["slidedp_web/outputs.py"], ["tests/backend/test_delete_overlap.py"]),
    # the export tests that need no training run (the others train for 7-11 s per module)
    "export": Target(["slidedp/persist/export.py"], [
        "tests/runtime/test_export_files.py",
        "tests/runtime/test_export.py::test_tied_embeddings_export_without_a_separate_lm_head",
        "tests/runtime/test_export_recovery.py::test_too_little_disk_is_refused_before_writing",
        "tests/runtime/test_export_recovery.py"
        "::test_any_failure_mid_write_removes_the_temporary_and_keeps_the_previous_export",
        "tests/runtime/test_export_recovery.py::test_export_hf_takes_an_iterable_of_unit_tensors",
    ]),
}
PACKAGES = {"slidedp": ROOT / "runtime" / "slidedp", "slidedp_web": ROOT / "backend" / "slidedp_web"}


def toml_value(value) -> str:
    return json.dumps(value)  # a TOML basic string, number, boolean or array of them reads the same as JSON


def prepare(name: str, files: list[str], tests: list[str]) -> Path:
    """The target's folder: the packages and tests linked in, and its pyproject.toml."""
    folder = WORK / name
    folder.mkdir(parents=True, exist_ok=True)
    for link, target in [*PACKAGES.items(), ("tests", ROOT / "tests"), ("docs", ROOT / "docs")]:
        path = folder / link
        if not path.is_symlink():
            path.symlink_to(target, target_is_directory=True)
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)
    options = dict(project["tool"].get("mutmut", {}))
    # mutmut runs the tests from a copy of tests/ in mutants/: docs/ goes with it, for the tests that read measured
    # results there (docs/results) by their path from the test file
    options.update(source_paths=sorted({f.split("/")[0] for f in files}), only_mutate=files,
                   pytest_add_cli_args_test_selection=tests, also_copy=["docs"])
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


def in_scope(mutant: str, scope: list[str]) -> bool:
    return not scope or any(fnmatch.fnmatch(mutant, pattern) for pattern in scope)


def survivors(folder: Path, scope: list[str]) -> tuple[dict[str, int], list[str]]:
    """Counts by outcome and the surviving mutants' names, from `mutmut results --all true`, of the mutants in
    the target's scope (the others are left unchecked by the run)."""
    out = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=folder, capture_output=True, text=True)
    counts: dict[str, int] = {}
    alive = []
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if not m or not in_scope(m.group(1), scope):
            continue
        counts[m.group(2)] = counts.get(m.group(2), 0) + 1
        if m.group(2) == "survived":
            alive.append(m.group(1))
    return counts, alive


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"some of: {', '.join(TARGETS)} (default: all)")
    ap.add_argument("--list", action="store_true", help="list the targets and their tests, run nothing")
    ap.add_argument("--max-children", type=int, default=1,
                    help="mutants run at once (default 1: the suite's machines have few cores, shared)")
    args = ap.parse_args()
    if args.list:
        for name, target in TARGETS.items():
            only = f" (only {', '.join(target.scope)})" if target.scope else ""
            print(f"{name}: mutates {', '.join(target.files)}{only}; tests {', '.join(target.tests)}")
        return 0
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; the targets are {', '.join(TARGETS)}")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    report = []
    for name in args.targets or list(TARGETS):
        target = TARGETS[name]
        folder = prepare(name, target.files, target.tests)
        print(f"== mutate {name}: {', '.join(target.files)} against {len(target.tests)} test selection(s)",
              flush=True)
        run = subprocess.run([str(MUTMUT), "run", "--max-children", str(args.max_children), *target.scope],
                             cwd=folder, env=env)
        counts, alive = survivors(folder, target.scope)
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
