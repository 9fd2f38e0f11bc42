"""The CPU demo: `slidedp train --config <packaged demo job.yaml>` trains and the loss clearly falls.

The job file the workbench's first-run preset uses, run as a user runs it (the installed command, no network,
no GPU), with only output_dir redirected. It takes ~30-60 s on two cores, so it is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from slidedp.config import load_config_file
from slidedp.data import demo_paths

DEMO_JOB = os.path.join(os.path.dirname(demo_paths()["demo_sft.jsonl"]), "job.yaml")


def _command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "slidedp")
    if os.path.exists(script):
        return [script]
    found = shutil.which("slidedp")
    return [found] if found else [sys.executable, "-m", "slidedp.cli"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_job_trains_on_cpu_and_the_loss_falls(tmp_path):
    job = load_config_file(DEMO_JOB)
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([*_command(), "train", "--config", DEMO_JOB, "--set", f"output_dir={out}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = job["steps"]
    # the demo is planned (its policy is AutoPolicy's): its steady steps are checked against the prediction
    assert isinstance(summary.pop("prediction_error"), float)
    assert summary == {"status": "completed", "steps_done": steps, "output_dir": str(out),
                       "final_dir": str(out / "final")}
    step_lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(step_lines) == steps  # one progress line per step

    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    losses = [r["loss"] for r in records]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0  # it starts near ln(512) = 6.24: an untrained model
    assert last <= 0.7 * first, f"loss fell only from {first:.3f} to {last:.3f}"
    # the demo keeps no checkpoints (checkpoint.interval 0) and exports a model transformers loads
    assert job["checkpoint"]["interval"] == 0 and not (out / "checkpoints").exists()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "final", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out / "final", local_files_only=True)
    ids = tok("7 + 2 =", return_tensors="pt")["input_ids"]
    assert model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3
