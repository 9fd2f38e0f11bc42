"""The import structure of the two packages, read from the source with `ast` (nothing is imported).

    .venv/bin/python -m pytest -q tests/test_layering.py

Every import counts: at module level, inside a function (a lazy import still makes one module depend on the
other) and under ``if TYPE_CHECKING:`` (a type-only import is still a dependency of the source). The rules:

- the rank step (slidedp.step) does not import the planner (slidedp.planning): the planner models the step,
  not the other way round;
- the runtime (runtime/slidedp) never imports the web package (slidedp_web): the web package registers its
  commands (`slidedp serve`, `slidedp worker`) with the runtime CLI through the ``slidedp.commands`` entry-point
  group, and the runtime runs on the GPU machine without it;
- no import cycle among slidedp modules, nor among slidedp_web modules;
- the backend's services (slidedp_web outside api/ and main.py) raise slidedp_web.errors, never HTTP errors.

The last tests run the runtime CLI: with the project installed `slidedp serve` and `slidedp worker` come from
that entry-point group, and without it `slidedp serve` says which extra provides it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"slidedp": ROOT / "runtime", "slidedp_web": ROOT / "backend"}


def module_files(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of a package (a package is its __init__)."""
    base = SOURCE_ROOTS[package]
    found: dict[str, Path] = {}
    for path in sorted((base / package).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES: dict[str, Path] = {**module_files("slidedp"), **module_files("slidedp_web")}


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def imported_names(module: str, source: str) -> Iterator[tuple[str, int]]:
    """(absolute dotted name, line) of every import statement anywhere in a module's source.

    `from X import a` yields X.a when X.a is a module of ours (a submodule import) and X otherwise; relative
    imports are resolved against the module's package.
    """
    tree = ast.parse(source, filename=str(MODULES.get(module, module)))
    package = module if module in MODULES and is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                if node.level > 1:
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in MODULES else base), node.lineno


def own_module(name: str) -> str | None:
    """The module of ours that importing `name` loads last (the longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports: line of the first such import}. `import a.b.c` also runs
    a and a.b (their __init__), but those are the packages' concern, not an edge of this module's."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        edges: dict[str, int] = {}
        for name, line in imported_names(module, path.read_text()):
            target = own_module(name)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = import_graph()


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def where(module: str, target: str) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{GRAPH[module][target]}: {module} imports {target}"


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One chain per strongly connected component with a cycle in it: a -> b -> ... -> a."""
    return [chain_in(graph, component) for component in tangles(graph)]


def tangles(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components that hold a cycle (modules that all reach each other)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0

    def connect(v: str) -> None:  # Tarjan, iteratively (no recursion limit to worry about)
        nonlocal counter
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def chain_in(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the chain a -> ... -> a."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return chain[::-1] + [start]
                if w in component and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # unreachable for a strongly connected component


# ---- the reader itself: the rules below are only as good as the imports it finds


def test_the_reader_finds_every_kind_of_import():
    source = (
        "from __future__ import annotations\n"
        "import slidedp.schedule\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .cost_model import Job\n"
        "from . import topology\n"
        "from .. import policy\n"
        "from slidedp.step import layout\n"
        "def later():\n"
        "    from slidedp_web.embedded import main\n"
        "    import slidedp.presets as p\n"
    )
    MODULES.setdefault("slidedp.planning.probe", ROOT / "runtime/slidedp/planning/probe.py")
    try:
        found = {name for name, _ in imported_names("slidedp.planning.probe", source)}
    finally:
        del MODULES["slidedp.planning.probe"]
    assert {
        "slidedp.schedule",
        "slidedp.planning.cost_model",
        "slidedp.planning.topology",
        "slidedp.policy",
        "slidedp.step.layout",
        "slidedp_web.embedded",
        "slidedp.presets",
    } <= found, found
    assert own_module("slidedp.planning.cost_model.Job") == "slidedp.planning.cost_model"
    assert own_module("slidedp_web.embedded.main") == "slidedp_web.embedded"


def test_the_reader_sees_both_packages():
    for module in (
        "slidedp.cli",
        "slidedp.planning.autopolicy",
        "slidedp.step.engine",
        "slidedp_web.embedded",
    ):
        assert module in MODULES, sorted(MODULES)
    assert GRAPH["slidedp.cli"], "slidedp.cli imports nothing of ours? the reader is broken"


def test_cycle_finder_reports_the_chain():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"e": 1}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


# ---- the rules


def test_step_does_not_import_planning():
    found = [
        where(m, t)
        for m in sorted(GRAPH)
        if under(m, "slidedp.step")
        for t in sorted(GRAPH[m])
        if under(t, "slidedp.planning")
    ]
    assert not found, "slidedp.step must not import slidedp.planning:\n" + "\n".join(found)


def test_runtime_does_not_import_the_web_package():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
        for module, path in MODULES.items()
        if under(module, "slidedp")
        for name, line in imported_names(module, path.read_text())
        if name == "slidedp_web" or name.startswith("slidedp_web.")
    ]
    assert not found, "runtime/slidedp must not import slidedp_web:\n" + "\n".join(found)


@pytest.mark.parametrize("package", ["slidedp", "slidedp_web"])
def test_no_import_cycles_within_a_package(package):
    """Within the runtime, and within the web backend (a lazy import inside a function is an edge too: it only
    hides the cycle from the interpreter until the function runs)."""
    own = {
        m: {t: line for t, line in e.items() if under(t, package)}
        for m, e in GRAPH.items()
        if under(m, package)
    }
    found = tangles(own)
    report = []
    for component in found:
        report.append(" -> ".join(chain_in(own, component)))
        report.extend(
            "    " + where(a, b) for a in sorted(component) for b in sorted(own[a]) if b in component
        )
    assert not found, (
        f"import cycles among {package} modules (every import inside each cycle listed):\n" + "\n".join(report)
    )


def framework_imports(module: str) -> Iterator[tuple[str, int]]:
    """(name, line) of every HTTPException or RequestValidationError a module imports, anywhere in it."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("fastapi", "starlette"):
            for alias in node.names:
                if alias.name in ("HTTPException", "RequestValidationError"):
                    yield f"{node.module}.{alias.name}", node.lineno


def test_backend_services_raise_their_own_refusals():
    """The services (slidedp_web outside api/ and the app in main.py) raise slidedp_web.errors; only the API turns
    them into HTTP answers."""
    services = [m for m in sorted(MODULES) if under(m, "slidedp_web") and not under(m, "slidedp_web.api")
                and m != "slidedp_web.main"]
    found = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {name}"
             for m in services for name, line in framework_imports(m)]
    assert not found, "services must raise slidedp_web.errors, not HTTP errors:\n" + "\n".join(found)


# ---- the runtime CLI finds the web commands through the entry-point group


def test_web_commands_are_registered_as_entry_points():
    from importlib.metadata import entry_points

    registered = {ep.name: ep.value for ep in entry_points(group="slidedp.commands")}
    if not registered:
        pytest.skip(
            "the project is not installed: `.venv/bin/pip install -e . --no-deps` registers the commands"
        )
    assert registered == {"serve": "slidedp_web.embedded:main", "worker": "slidedp_web.worker:main"}


def test_runtime_cli_without_the_web_package_says_which_extra_serves(tmp_path):
    # As on the GPU machine: runtime/ on the path, no installed distribution and no slidedp_web to import.
    # -I would drop PYTHONPATH too, so the installed project is hidden with -S (no site-packages) instead.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(ROOT / "runtime")
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "slidedp.cli", "serve", "--port", "1"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "pip install 'slidedp[web]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    help_proc = subprocess.run(
        [sys.executable, "-S", "-m", "slidedp.cli", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert help_proc.returncode == 0, help_proc.stderr
    for command in ("train", "plan", "serve", "worker"):
        assert command in help_proc.stdout, help_proc.stdout


def _echo_command(argv: list[str]) -> int:
    print("echo:" + " ".join(argv))
    return 7


def test_runtime_cli_runs_a_registered_command_and_lists_it(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from slidedp import cli

    fake = EntryPoint(name="echo", value=f"{__name__}:_echo_command", group=cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "registered_commands", lambda: {"echo": fake})
    assert cli.main(["echo", "--port", "9"]) == 7
    assert capsys.readouterr().out == "echo:--port 9\n"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())  # argparse wraps the help column
    assert "echo" in listing and f"provided by {__name__}" in listing
    # serve and worker are not registered here: listed with the extra that provides them
    assert "run the workbench (needs the web extra: pip install 'slidedp[web]')" in listing


def test_runtime_cli_names_the_extra_when_its_dependencies_are_missing(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from slidedp import cli

    absent = EntryPoint(
        name="serve", value="slidedp_web_not_installed.embedded:main", group=cli.COMMANDS_GROUP
    )
    monkeypatch.setattr(cli, "registered_commands", lambda: {"serve": absent})
    assert cli.main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "slidedp serve needs the web extra" in err and "'slidedp_web_not_installed'" in err, err
    assert "pip install 'slidedp[web]'" in err


def test_runtime_cli_reports_a_missing_module_of_another_command_without_naming_an_extra(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from slidedp import cli

    absent = EntryPoint(name="extra-tool", value="some_absent_package:main", group=cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "registered_commands", lambda: {"extra-tool": absent})
    assert cli.main(["extra-tool"]) == 2
    assert (
        capsys.readouterr().err
        == "slidedp extra-tool cannot run here: no module named 'some_absent_package'\n"
    )
