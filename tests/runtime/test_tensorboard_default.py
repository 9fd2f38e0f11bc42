"""Every install that serves the UI writes the TensorBoard event files the job page points to: the `web` extra
names the package that the default tracker's writer imports, a default CPU run writes event files, and the job
as the API answers it says whether they exist (JobPublic.tensorboard_events), so that the page names the folder
only when there is something in it.

    .venv/bin/python -m pytest -q tests/runtime/test_tensorboard_default.py
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest
import slidedp
from slidedp import trackers

from tests.runtime.exactness import make_token_data, read_metrics

ROOT = Path(__file__).resolve().parents[2]
SEQ = 16


def _requirement_name(req: str) -> str:
    """A requirement's distribution name as PEP 503 normalises it ("uvicorn[standard]>=0.30" -> "uvicorn")."""
    name = re.match(r"[A-Za-z0-9._-]+", req.strip()).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_web_extra_installs_what_the_default_tracker_imports():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    web = {_requirement_name(r) for r in project["optional-dependencies"]["web"]}
    base = {_requirement_name(r) for r in project["dependencies"]}
    assert trackers.requested(None) == ["tensorboard"]  # the default a job from the UI gets
    needed = {package for _module, package in trackers.PACKAGES["tensorboard"]}
    assert needed == {"tensorboard"}
    assert needed <= web, f"the web extra lacks {sorted(needed - web)}: a job run from the UI writes no event files"
    assert "torch" in base  # TensorBoardWriter writes through torch.utils.tensorboard
    # and with them installed, the writer's own imports work (torch's wrapper refuses without the package)
    assert trackers.missing_packages("tensorboard") == []
    assert hasattr(importlib.import_module("torch.utils.tensorboard"), "SummaryWriter")


def _job_public(output_dir: str):
    from slidedp_web.models import JobPublic

    return JobPublic(id=1, name=None, status="completed", config={}, host=None, policy=None, created_at=None,
                     started_at=None, finished_at=None, step=2, steps=2, last_metrics=None, error=None, eta_s=None,
                     tokens_per_s=None, output_dir=output_dir, checkpoints=[])


def test_a_default_cpu_run_writes_event_files_and_the_job_says_so(tmp_path):
    pytest.importorskip("slidedp_web", reason="the web package is not importable")
    data = make_token_data(str(tmp_path / "train.jsonl"), rows=8, seq_len=SEQ, seed=3)
    out = str(tmp_path / "out")
    assert not trackers.tensorboard_events(out) and _job_public(out).tensorboard_events is False  # no folder yet
    logs: list[str] = []
    cfg = {
        "model": "tiny-qwen3", "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": SEQ,
        "micro_batch_size": 2, "steps": 2, "ranks": 1, "precision": "fp32", "output_dir": out, "export": False,
        "cpu_threads": 1,  # report_to left out: the default, as the job form sends it
        "policy": {"delivery": "replicated", "grad_reduce": "host", "edge_update": "host", "device_layers": 0,
                   "resident_units": 0, "activations": "checkpoint"},
    }
    result = slidedp.train(cfg, on_log=logs.append)
    assert result.status == "completed" and [r["step"] for r in read_metrics(out)] == [1, 2]
    events = sorted(Path(out, "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0, os.listdir(out)
    assert any(line.startswith(f"reporting to tensorboard: {out}/tensorboard") for line in logs), logs
    assert trackers.tensorboard_events(out) is True
    job = _job_public(out).model_dump()
    assert job["tensorboard_events"] is True
    # an empty folder (a run that wrote none) is not a folder of event files
    os.makedirs(tmp_path / "empty" / "tensorboard")
    assert _job_public(str(tmp_path / "empty")).model_dump()["tensorboard_events"] is False
