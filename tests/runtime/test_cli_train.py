"""`slidedp train` refuses an output_dir that holds something, unless the job resumes or --overwrite is given.

slidedp.train() itself keeps starting fresh runs there (the web service and scripts decide for themselves).
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp import cli  # noqa: E402

from tests.runtime.exactness import make_token_data  # noqa: E402


@pytest.fixture
def job(tmp_path):
    data = make_token_data(str(tmp_path / "data.jsonl"), rows=4, seq_len=32, seed=2)
    out = tmp_path / "out"
    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32, "micro_batch_size": 2,
           "steps": 1, "ranks": 1, "precision": "fp32", "output_dir": str(out), "cpu_threads": 1,
           "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint",
                      "resident_units": 0}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return {"config": str(path), "out": out}


@pytest.fixture
def calls(monkeypatch):
    """slidedp.train replaced: the tests here are about the command's decision, not training."""
    import slidedp.launch as launch

    seen: list = []

    def fake_train(cfg, on_log=None, **kwargs):
        seen.append(cfg)
        return launch.TrainResult("completed", cfg.steps, [], cfg.output_dir, None, None, {})

    monkeypatch.setattr(launch, "train", fake_train)
    return seen


def test_a_non_empty_output_dir_is_refused(job, calls, capsys):
    out = job["out"]
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    rc = cli.main(["train", "--config", job["config"]])
    err = capsys.readouterr().err
    assert rc == 2 and calls == []
    assert f"output_dir: output_dir {out} is not empty" in err
    assert "checkpoints/" in err and "metrics.jsonl" in err
    assert "resume: true" in err and "--overwrite" in err
    assert sorted(os.listdir(out)) == ["checkpoints", "metrics.jsonl"]  # nothing touched


def test_a_file_where_the_output_dir_should_be_is_refused(job, calls, capsys):
    job["out"].write_text("x", encoding="utf-8")
    assert cli.main(["train", "--config", job["config"]]) == 2 and calls == []
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--overwrite"], ["--set", "resume=true"]], ids=["overwrite", "resume"])
def test_resume_or_overwrite_lets_it_run(job, calls, capsys, args):
    (job["out"]).mkdir()
    (job["out"] / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    assert cli.main(["train", "--config", job["config"], *args]) == 0
    assert len(calls) == 1 and calls[0].resume == ("--overwrite" not in args)


def test_an_empty_or_missing_output_dir_is_fine(job, calls):
    assert cli.main(["train", "--config", job["config"]]) == 0
    job["out"].mkdir()
    assert cli.main(["train", "--config", job["config"]]) == 0
    assert len(calls) == 2


def test_overwrite_trains_for_real(job, capsys):
    job["out"].mkdir()
    (job["out"] / "notes.txt").write_text("earlier run", encoding="utf-8")
    assert cli.main(["train", "--config", job["config"]]) == 2
    capsys.readouterr()
    assert cli.main(["train", "--config", job["config"], "--overwrite"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["final_dir"] == str(job["out"] / "final")
    assert "model.safetensors" in os.listdir(job["out"] / "final")
    assert (job["out"] / "notes.txt").exists()  # a fresh run removes only its own kinds of files


def test_the_python_api_still_starts_fresh_in_a_used_output_dir(job):
    import slidedp

    job["out"].mkdir()
    (job["out"] / "notes.txt").write_text("earlier run", encoding="utf-8")
    with open(job["config"], encoding="utf-8") as fh:
        cfg = json.load(fh)
    result = slidedp.train({**cfg, "export": False})
    assert result.status == "completed" and (job["out"] / "notes.txt").exists()


@pytest.mark.slow
def test_a_two_rank_cli_run_prints_no_library_warning(tmp_path):
    """The command's own output and its ranks' (which write to the same terminal) carry no FutureWarning or
    other library warning: the collectives are called by the names this torch has (slidedp.step.collectives)."""
    import subprocess
    import sys

    data = make_token_data(str(tmp_path / "data.jsonl"), rows=8, seq_len=32, seed=2)
    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32, "micro_batch_size": 2,
           "steps": 2, "ranks": 2, "precision": "fp32", "output_dir": str(tmp_path / "out"), "cpu_threads": 1,
           "export": False, "policy": {"delivery": "sharded", "grad_reduce": "gpu"}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    runtime = os.path.join(os.path.dirname(__file__), "..", "..", "runtime")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(runtime)}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "slidedp.cli", "train", "--config", str(path), "--progress", "lines"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "step     2/2" in out
    assert "Warning" not in out, out[-3000:]


def test_train_and_plan_name_every_problem_of_a_config_at_once(tmp_path, capsys):
    """A config with bad keys, a missing model and a missing dataset: one answer lists all four."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"model": str(tmp_path / "nope"), "data": {"path": str(tmp_path / "nope.jsonl")},
                                "seq_len": 0, "steps": "abc"}), encoding="utf-8")
    for argv in (["plan", "--config", str(path), "--no-calibration"], ["train", "--config", str(path)]):
        assert cli.main(argv) == 2
        out = capsys.readouterr()
        text = out.out + out.err
        for key in ("seq_len:", "steps:", "model:", "data.path:"):
            assert key in text, (argv, text)
