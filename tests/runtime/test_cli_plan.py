"""`slidedp plan` answers in words, never with a traceback, and plans a job given by bench's flags as it plans the
same job from a file (the real CLI: a process of its own for the host without GPUs, `main` for the rest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from slidedp import cli

JOB = {"model": "tiny-qwen3", "seq_len": 64, "micro_batch_size": 2, "gpus": 1, "data": cli.FLAG_JOB_DATA}
FLAGS = ["--model", "tiny-qwen3", "--seq", "64", "--mbs", "2", "--gpus", "1"]


def _slidedp(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # this host, as one without GPUs
    return subprocess.run([sys.executable, "-m", "slidedp.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.timeout(300)
def test_a_gpu_job_on_a_host_without_gpus_is_answered_in_words(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    for argv in (["--config", str(job)], FLAGS):
        done = _slidedp("plan", *argv)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "Traceback" not in done.stdout + done.stderr
        assert done.stdout == ""
        assert "asks for 1 GPU(s) but this host has no GPU (CUDA is not available here)" in done.stderr
        assert "--no-calibration" in done.stderr and "--profile NAME" in done.stderr
        assert "slidedp profiles" in done.stderr
        assert "calibrating this host" not in done.stderr  # said before anything was started to measure
    done = _slidedp("plan", *FLAGS, "--no-calibration")  # the way out it names answers
    assert done.returncode == 3 and "Traceback" not in done.stdout + done.stderr
    assert "gpus: asks for 1 GPUs but this host has 0" in done.stdout


def _plan_json(capsys, *argv: str) -> dict:
    rc = cli.main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert rc in (0, 3), out
    return json.loads(out)


def test_bench_flags_plan_the_cpu_job_the_config_file_does(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({**JOB, "gpus": 0}))
    from_file = _plan_json(capsys, "--config", str(job), "--no-calibration")
    from_flags = _plan_json(capsys, *FLAGS[:-1], "0", "--no-calibration")
    assert from_flags == from_file
    assert from_flags["feasible"] and from_flags["policy"]["delivery"]


def test_bench_flags_plan_the_gpu_job_the_config_file_does_on_a_profile(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({**JOB, "gpu_memory_gib": 12}))
    how = ("--profile", "1x-l4-64g")
    from_file = _plan_json(capsys, "--config", str(job), *how)
    from_flags = _plan_json(capsys, *FLAGS, "--gpu-memory-gib", "12", *how)
    assert from_flags == from_file
    assert from_flags["feasible"] and from_flags["predicted"]["step_time_s"] > 0  # priced from the profile
    uncapped = _plan_json(capsys, *FLAGS, *how)
    assert uncapped != from_flags  # the cap is taken, not ignored


@pytest.mark.parametrize("argv, said", [
    (["--model", "tiny-qwen3", "--seq", "64"], "missing --mbs --gpus"),
    (["--config", "job.yaml", "--gpus", "2"], "not both"),
    ([], "--config JOB.yaml, or --model PRESET_OR_DIR --seq N --mbs N --gpus N"),
])
def test_plan_says_what_job_flags_are_missing_or_too_many(capsys, argv, said):
    assert cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err
