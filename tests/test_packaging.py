"""The runtime stands alone: it imports and trains without the web stack, and its planning half without torch.

The GPU machine has torch and transformers but no fastapi, celery, redis or pydantic, and runs the runtime as
``PYTHONPATH=runtime python3 ...``. These tests reproduce that in a subprocess of this interpreter: a
``sitecustomize`` on PYTHONPATH marks every web package as absent before anything else is imported, so a stray
``import fastapi`` anywhere in the runtime (or in a rank process it spawns) fails here as it would there.

    .venv/bin/python -m pytest -q tests/test_packaging.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime"

WEB_PACKAGES = (
    "fastapi", "starlette", "sqlmodel", "sqlalchemy", "celery", "kombu", "redis",
    "pydantic", "pydantic_settings", "uvicorn", "alembic",
)  # fmt: skip

# Modules the web API imports in a process without torch (docs/architecture.md §1: config, validation, planner).
TORCH_FREE = (
    "slidedp",
    "slidedp.config",
    "slidedp.policy",
    "slidedp.schedule",
    "slidedp.step.layout",
    "slidedp.presets",
    "slidedp.validation",
    "slidedp.host_memory",
    "slidedp.planning.topology",
    "slidedp.planning.cost_model",
    "slidedp.planning.overlap",
    "slidedp.planning.marginal",
    "slidedp.planning.autopolicy",
    "slidedp.planning.report",
)

# Setting sys.modules[name] = None is how Python itself spells "not installed": `import name` raises
# ModuleNotFoundError and importlib.util.find_spec(name) answers None, so optional-dependency probes
# (transformers checks for pydantic this way) see the package as missing rather than crashing. The finder
# catches anything that removes those entries again.
SITECUSTOMIZE = textwrap.dedent(
    """
    import sys

    BLOCKED = {blocked!r}


    class WebStackAbsent:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)", name=name)
            return None


    sys.meta_path.insert(0, WebStackAbsent())
    for _name in BLOCKED:
        sys.modules[_name] = None
    """
)


def module_path(name: str) -> Path:
    """Where a slidedp module lives in the source tree (a package's __init__.py or a module file)."""
    rel = Path(*name.split("."))
    pkg = RUNTIME / rel / "__init__.py"
    return pkg if pkg.exists() else RUNTIME / rel.with_suffix(".py")


@pytest.fixture()
def no_web_env(tmp_path: Path) -> dict[str, str]:
    """Environment of a process that sees runtime/ on PYTHONPATH and no web packages at all."""
    site = tmp_path / "no_web_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=set(WEB_PACKAGES)))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(RUNTIME)]),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_python(code: str, env: dict[str, str], cwd: Path, timeout: float) -> dict:
    """Run code in a fresh interpreter; it prints one JSON object as its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_web_packages_are_really_absent_in_the_simulated_gpu_environment(no_web_env, tmp_path):
    # Without this the test below could pass because the blocker silently failed to load.
    out = run_python(
        f"""
        import importlib, importlib.util, json
        absent = {{}}
        for name in {WEB_PACKAGES!r}:
            try:
                importlib.import_module(name)
                absent[name] = False
            except ImportError:
                absent[name] = importlib.util.find_spec(name) is None
        print(json.dumps(absent))
        """,
        no_web_env, tmp_path, timeout=60,
    )  # fmt: skip
    assert out == {name: True for name in WEB_PACKAGES}


def test_runtime_imports_without_the_web_stack(no_web_env, tmp_path):
    out = run_python(
        f"""
        import importlib, json
        files = {{n: importlib.import_module(n).__file__ for n in {TORCH_FREE!r}}}
        print(json.dumps(files))
        """,
        no_web_env, tmp_path, timeout=120,
    )  # fmt: skip
    # The source tree, not an installed copy, is what the GPU machine runs.
    assert sorted(out) == sorted(TORCH_FREE)
    for name, file in out.items():
        assert Path(file).resolve() == module_path(name).resolve(), name


def test_cli_help_runs_without_the_web_stack(no_web_env, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "slidedp.cli", "--help"],
        env=no_web_env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    for command in ("train", "plan", "topology", "bench"):
        assert command in proc.stdout, f"`slidedp --help` does not list {command!r}:\n{proc.stdout}"


@pytest.mark.slow
def test_tiny_training_runs_without_the_web_stack(no_web_env, tmp_path):
    seq_len, micro_batch = 32, 2
    data = tmp_path / "tokens.jsonl"
    # One learnable sequence repeated: after one AdamW step on it the loss on the same batch must drop.
    row = [(7 * i + 3) % 509 + 1 for i in range(seq_len)]
    data.write_text("".join(json.dumps({"input_ids": row}) + "\n" for _ in range(16)))
    config = {
        "model": "tiny-qwen3",
        "data": {"path": str(data), "format": "tokens", "shuffle": False},
        "seq_len": seq_len,
        "micro_batch_size": micro_batch,
        "steps": 2,
        "gpus": 0,
        "ranks": 1,
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"interval": 0},
        "export": False,
        "output_dir": str(tmp_path / "run"),
    }
    out = run_python(
        f"""
        import json, sys
        import slidedp
        result = slidedp.train({config!r})
        web = sorted(n for n in {WEB_PACKAGES!r} if sys.modules.get(n) is not None)
        print(json.dumps({{"status": result.status, "steps_done": result.steps_done,
                          "metrics": result.metrics, "web": web}}))
        """,
        no_web_env, tmp_path, timeout=400,
    )  # fmt: skip
    assert out["web"] == []
    assert out["status"] == "completed"
    assert out["steps_done"] == 2
    metrics = out["metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["tokens"] == micro_batch * seq_len for m in metrics)
    losses = [m["loss"] for m in metrics]
    assert all(isinstance(x, float) and 0.0 < x < 50.0 for x in losses), losses
    assert losses[1] < losses[0], f"loss did not fall on a repeated batch: {losses}"
    # metrics.jsonl carries the same records the API stores.
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == losses


@pytest.mark.parametrize("name", TORCH_FREE)
def test_planning_half_imports_no_torch(name, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(RUNTIME))
    out = run_python(
        f"""
        import importlib, json, sys
        importlib.import_module({name!r})
        heavy = sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)
        print(json.dumps(heavy))
        """,
        env, tmp_path, timeout=60,
    )  # fmt: skip
    assert out == [], f"importing {name} pulled in {out}"


def test_console_script_help_runs():
    script = Path(sys.executable).parent / "slidedp"
    if not script.exists():
        pytest.skip(f"no console script at {script}: install the project (`make install`)")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "usage" in proc.stdout.lower()
    for command in ("train", "plan", "topology", "bench", "serve", "worker"):
        assert command in proc.stdout, f"`slidedp --help` does not list {command!r}:\n{proc.stdout}"
        sub = subprocess.run([str(script), command, "--help"], capture_output=True, text=True, timeout=120)
        assert sub.returncode == 0, f"`slidedp {command} --help` failed:\n{sub.stderr[-3000:]}"
        assert f"slidedp {command}" in sub.stdout, sub.stdout
