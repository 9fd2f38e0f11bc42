"""Experiment trackers (config `report_to`): TensorBoard, W&B (offline) and MLflow (its local store) hold every
number of every metrics record at its step and the job config, as their own readers read them back; a tracker a
job names but this host lacks is a config error; the default TensorBoard without its package writes nothing and
says so; a resumed job's TensorBoard steps continue.

Real train() runs of tiny-qwen3 on one CPU rank, a few steps of 16 tokens.

    .venv/bin/python -m pytest -q tests/runtime/test_trackers.py
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import slidedp
from slidedp.config import ConfigError, JobConfig
from slidedp.trackers import Trackers, numbers
from slidedp.validation import check_config, validate_job

from tests.runtime.exactness import make_token_data, read_metrics

pytest.importorskip("tensorboard", reason="the trackers extra is not installed (pip install 'slidedp[trackers]')")
pytest.importorskip("wandb", reason="the trackers extra is not installed")
pytest.importorskip("mlflow", reason="the trackers extra is not installed")

SEQ = 16
RUN_NAME = "trackers-test"
ALL = ["tensorboard", "wandb", "mlflow"]
# names every record of these runs has, and those only some have (evaluation after steps 2 and 4, before step 1)
EVERY_STEP = ["loss", "lr", "grad_norm", "clipped", "step_time_s", "tokens_per_s", "host_rss_gib", "tokens",
              "phases/forward", "phases/backward", "cpu_s/rank", "bytes/h2d/0"]
EVAL = ["eval_loss", "eval_ppl", "eval_tokens"]


def _config(data: str, out: str, **extra) -> dict:
    return {
        "model": "tiny-qwen3", "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": SEQ,
        "micro_batch_size": 2, "steps": 4, "ranks": 1, "precision": "fp32", "output_dir": out, "export": False,
        "cpu_threads": 1, "optimizer": {"lr": 3e-3},
        # an explicit policy: no planning, so no calibration of this host
        "policy": {"delivery": "replicated", "grad_reduce": "host", "edge_update": "host", "device_layers": 0,
                   "resident_units": 0, "activations": "checkpoint"},
        **extra,
    }


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID",
                     "WANDB_API_KEY"):
            mp.delenv(name, raising=False)
        mp.setenv("WANDB_MODE", "offline")  # no network: W&B writes its run to WANDB_DIR only
        mp.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            mp.setenv(name, str(root / name.lower()))
            os.makedirs(root / name.lower())
        yield {"root": root, "data": make_token_data(str(root / "train.jsonl"), rows=16, seq_len=SEQ, seed=1)}


@pytest.fixture(scope="module")
def every_tracker(env):
    """One run reporting to all three, with evaluation, as a job named RUN_NAME."""
    out = str(env["root"] / "all")
    logs: list[str] = []
    cfg = _config(env["data"], out, report_to=ALL, eval={"holdout": 0.25, "interval": 2, "max_batches": 1})
    result = slidedp.train(cfg, on_log=logs.append, run_name=RUN_NAME)
    assert result.status == "completed"
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    return {"out": out, "records": records, "logs": logs, "config": cfg}


def _f32(value: float) -> float:
    return float(np.float32(value))  # TensorBoard keeps a scalar as a 32-bit float


def _tensorboard(folder: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return acc


# ------------------------------------------------------------------------------------------------ TensorBoard
def test_tensorboard_holds_each_record_number_at_its_step_under_the_record_s_name(every_tracker):
    records = every_tracker["records"]
    acc = _tensorboard(os.path.join(every_tracker["out"], "tensorboard"))
    tags = set(acc.Tags()["scalars"])
    assert set(EVERY_STEP + EVAL + ["eval_loss_start", "eval_ppl_start"]) <= tags
    assert tags == {name for r in records for name in numbers(r)}  # and nothing the records do not hold
    for name in EVERY_STEP:
        assert [(e.step, e.value) for e in acc.Scalars(name)] == [(r["step"], _f32(numbers(r)[name]))
                                                                  for r in records], name
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(r["step"], _f32(r["loss"])) for r in records]
    assert [(e.step, e.value) for e in acc.Scalars("eval_loss")] == [
        (r["step"], _f32(r["eval_loss"])) for r in records if "eval_loss" in r]
    assert [e.step for e in acc.Scalars("eval_loss")] == [2, 4]
    assert [(e.step, e.value) for e in acc.Scalars("eval_loss_start")] == [(1, _f32(records[0]["eval_loss_start"]))]


def test_tensorboard_holds_the_job_config_as_hparams(every_tracker):
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = _tensorboard(os.path.join(every_tracker["out"], "tensorboard"))
    content = acc.PluginTagToContent("hparams")
    start = [plugin_data_pb2.HParamsPluginData.FromString(c).session_start_info for c in content.values()]
    hparams = next(s.hparams for s in start if s.hparams)
    assert hparams["optimizer.lr"].number_value == pytest.approx(3e-3)
    assert hparams["seq_len"].number_value == SEQ
    assert hparams["data.format"].string_value == "tokens"
    assert hparams["report_to"].string_value == json.dumps(ALL)
    assert hparams["init_from"].string_value == "null"


# ------------------------------------------------------------------------------------------------ W&B
def test_wandb_offline_run_holds_each_record_and_the_config(every_tracker, env):
    (path,) = glob.glob(str(env["root"] / "wandb_dir" / "wandb" / "offline-run-*" / "run-*.wandb"))
    # W&B's own reader of a run's log: one JSON record per line
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in log if r["type"] == "history"}
    records = every_tracker["records"]
    assert sorted(history) == [1, 2, 3, 4]
    for r in records:
        logged = {k: v for k, v in history[r["step"]].items() if not k.startswith("_")}
        assert logged == numbers(r), r["step"]  # every number, exactly (W&B keeps doubles)
    run = next(r["run"] for r in log if r["type"] == "run")
    assert run["display_name"] == RUN_NAME and run["project"] == "slidedp"
    config = {}
    for r in log:
        if r["type"] == "config":
            config.update(r["config"].get("update", {}))
    assert config["optimizer.lr"] == 3e-3 and config["seq_len"] == SEQ and config["data.format"] == "tokens"
    assert [r["exit"]["exit_code"] for r in log if r["type"] == "exit"] == [0]
    kept = json.loads(open(os.path.join(every_tracker["out"], "trackers.json"), encoding="utf-8").read())
    assert path.endswith(f"run-{kept['wandb_run_id']}.wandb")  # the id a resumed job continues


# ------------------------------------------------------------------------------------------------ MLflow
def test_mlflow_local_store_holds_each_record_and_the_config_as_params(every_tracker):
    from mlflow.tracking import MlflowClient

    out = every_tracker["out"]
    client = MlflowClient(tracking_uri="sqlite:///" + os.path.join(out, "mlflow", "mlflow.db"))
    experiment = client.get_experiment_by_name("slidedp")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == RUN_NAME and run.info.status == "FINISHED"
    records = every_tracker["records"]
    for name in EVERY_STEP + EVAL:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert history == [(r["step"], numbers(r)[name]) for r in records if name in numbers(r)], name
    params = run.data.params
    assert params["optimizer.lr"] == "0.003" and params["seq_len"] == str(SEQ)
    assert params["report_to"] == json.dumps(ALL) and params["output_dir"] == out
    assert any(line.startswith("reporting to tensorboard: ") and "wandb: run " in line and "mlflow: run " in line
               for line in every_tracker["logs"])


# ------------------------------------------------------------------------------------------------ packages
def test_a_named_tracker_whose_package_is_missing_is_a_config_error_naming_it(env, monkeypatch, tmp_path):
    cfg = _config(env["data"], str(tmp_path / "out"), report_to=["tensorboard", "wandb"])
    assert validate_job(JobConfig.from_dict(cfg)) == []
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python spells "not installed"
    errors = validate_job(JobConfig.from_dict(cfg))
    assert [e["loc"] for e in errors] == ["report_to"]
    assert "wandb" in errors[0]["msg"] and "pip install 'slidedp[trackers]'" in errors[0]["msg"]
    assert errors == check_config(cfg).errors  # the web API's one answer holds it
    with pytest.raises(ConfigError) as err:
        slidedp.train(cfg)
    assert err.value.errors == errors and not os.path.exists(cfg["output_dir"])  # before anything is written

    # MLflow's own store in the job's folder needs SQLAlchemy; a tracking server does not
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    mlflow = validate_job(JobConfig.from_dict({**cfg, "report_to": ["mlflow"]}))
    assert [e["loc"] for e in mlflow] == ["report_to"] and "sqlalchemy" in mlflow[0]["msg"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert validate_job(JobConfig.from_dict({**cfg, "report_to": ["mlflow"]})) == []

    # W&B online needs an API key; the check runs before the job is queued, not once it runs
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login user password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.delitem(sys.modules, "wandb")
    wandb = {**cfg, "report_to": ["wandb"]}
    assert validate_job(JobConfig.from_dict(wandb)) == []  # WANDB_MODE=offline (the fixture's)
    monkeypatch.delenv("WANDB_MODE")
    online = validate_job(JobConfig.from_dict(wandb))
    assert [e["loc"] for e in online] == ["report_to"] and "WANDB_API_KEY" in online[0]["msg"]
    assert "api.wandb.ai" in online[0]["msg"] and "WANDB_MODE=offline" in online[0]["msg"]
    netrc.write_text("machine api.wandb.ai login user password not-a-real-key\n")  # what `wandb login` writes
    assert validate_job(JobConfig.from_dict(wandb)) == []

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    named = validate_job(JobConfig.from_dict({**cfg, "report_to": ["tensorboard"]}))
    assert [e["loc"] for e in named] == ["report_to"] and "tensorboard" in named[0]["msg"]
    assert validate_job(JobConfig.from_dict(_config(env["data"], str(tmp_path / "out")))) == []  # the default


def test_report_to_takes_a_list_of_known_trackers():
    base = {"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}}
    assert JobConfig.from_dict(base).report_to is None
    assert JobConfig.from_dict({**base, "report_to": []}).report_to == []

    def errors(value):
        with pytest.raises(ConfigError) as err:
            JobConfig.from_dict({**base, "report_to": value})
        return err.value.errors

    assert errors("wandb") == [{"loc": "report_to", "msg": "must be a list of strings, got 'wandb': write "
                                                           "[\"wandb\"]"}]
    assert errors(["tensorboard", "tb"])[0]["loc"] == "report_to[1]"
    assert errors(["none", "wandb"])[0]["loc"] == "report_to"


def test_the_default_tensorboard_without_its_package_writes_nothing_and_says_so_once(env, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    out = str(tmp_path / "out")
    logs: list[str] = []
    result = slidedp.train(_config(env["data"], out, steps=2), on_log=logs.append)
    assert result.status == "completed" and [r["step"] for r in read_metrics(out)] == [1, 2]
    said = [line for line in logs if "tensorboard" in line.lower()]
    assert said == ["no TensorBoard event files: the tensorboard package is not installed here (pip install "
                    "'slidedp[trackers]' to have them)"]
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]


# ------------------------------------------------------------------------------------------------ resume
@pytest.mark.slow
def test_a_resumed_run_continues_its_tensorboard_steps(env):
    """An attempt logged steps 1..3 and kept a checkpoint of step 2 only (it died before step 3's); the resumed
    attempt runs steps 3..5 again. TensorBoard reads each step once, with the values metrics.jsonl holds."""
    out = str(env["root"] / "resumed")
    cfg = _config(env["data"], out, steps=3, report_to=["tensorboard"], checkpoint={"interval": 2, "keep": 2})
    first = slidedp.train(cfg)
    assert first.status == "completed"
    shutil.rmtree(os.path.join(out, "checkpoints", "step-00000003"))
    first_step3 = read_metrics(out)[2]
    second = slidedp.train({**cfg, "steps": 5, "resume": True})
    assert second.status == "completed" and second.metrics[0]["step"] == 3
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    folder = os.path.join(out, "tensorboard")
    assert len(glob.glob(os.path.join(folder, "events.out.tfevents.*"))) == 2  # one file per attempt
    acc = _tensorboard(folder)
    for name in ("loss", "grad_norm", "step_time_s", "phases/forward"):
        assert [(e.step, e.value) for e in acc.Scalars(name)] == [(r["step"], _f32(numbers(r)[name]))
                                                                  for r in records], name
    assert records[2]["step_time_s"] != first_step3["step_time_s"]  # so step 3 above is the resumed attempt's

    fresh = Trackers(JobConfig.from_dict(cfg), 0)  # what a run with resume false opens: the earlier events go
    for r in records[:2]:
        fresh.log(r)
    fresh.close("completed")
    assert len(glob.glob(os.path.join(folder, "events.out.tfevents.*"))) == 1
    assert [e.step for e in _tensorboard(folder).Scalars("loss")] == [1, 2]


def test_trackers_end_their_runs_as_the_job_ended(every_tracker, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    # the store the run above made, as a tracking server would be: MLflow creates a store's tables once, slowly
    uri = "sqlite:///" + os.path.join(every_tracker["out"], "mlflow", "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "ended")
    cfg = JobConfig.from_dict(_config("unused.jsonl", str(tmp_path / "out"), report_to=["mlflow"]))
    trackers = Trackers(cfg, 0, "ended")
    trackers.log({"step": 1, "loss": 2.5, "warnings": [{"step": 1, "kind": "loss_spike", "message": "x"}],
                  "diverged": "text", "mfu": None, "grad_norm": float("nan")})
    trackers.close("stopped")
    trackers.close("failed")  # closed already: nothing changes
    assert not (tmp_path / "out" / "mlflow").exists()  # MLFLOW_TRACKING_URI names the store
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ended").experiment_id])
    assert run.info.status == "KILLED" and run.data.metrics == {"loss": 2.5}

    resumed = Trackers(cfg, 1, "ended")  # the same run again, from trackers.json
    resumed.close("failed")
    (again,) = client.search_runs([client.get_experiment_by_name("ended").experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FAILED"
