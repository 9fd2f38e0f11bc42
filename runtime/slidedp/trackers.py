"""Experiment trackers (config `report_to`): the metrics records and the job config, to TensorBoard, Weights &
Biases and MLflow.

    trackers = Trackers(cfg, start_step, run_name, on_log)   # opens each tracker the job names
    trackers.log(record)                                     # one metrics record (docs/interfaces.md §3)
    trackers.close("completed")                              # or "stopped", "failed"; a second close does nothing

The launcher (slidedp.launch) feeds it each record it relays from rank 0, where it writes metrics.jsonl, so a job
has one writer whatever its rank count. A record's numbers are logged at its step under the record's own names,
nested ones joined with "/" (`phases/forward`, `hbm_peak_gib/0`, `bytes/h2d/1`), booleans as 0 or 1; text, null
and non-finite values are left out, as metrics.jsonl writes them null. The job config is logged when a tracker's
run begins, flattened to dotted keys (`optimizer.lr`): TensorBoard hparams, the W&B run config, MLflow params.

Resume: a job continuing from step k writes into the same TensorBoard folder with purge_step k + 1, so TensorBoard
reads the steps after k that an interrupted attempt had logged only as they are run again; W&B and MLflow continue
the run whose id output_dir/trackers.json kept. A fresh run (step 0) removes the event files of an earlier run in
that folder and starts new W&B and MLflow runs.

Imports no torch and no tracker at module level: validation (which the web API runs without torch) asks
`missing_packages` whether this host can run a tracker.
"""

from __future__ import annotations

import importlib.util
import json
import math
import netrc
import os
import shlex
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slidedp import atomic_file
from slidedp.config import ConfigError, JobConfig

TENSORBOARD_DIR = "tensorboard"  # under output_dir
EVENTS_GLOB = "events.out.tfevents.*"  # the event files' names in that folder
MLFLOW_DIR = "mlflow"  # under output_dir: the local store when MLFLOW_TRACKING_URI is not set
STATE_FILE = "trackers.json"  # under output_dir: the W&B and MLflow run ids a resumed job continues
PROJECT = "slidedp"  # W&B project and MLflow experiment unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME say otherwise
EXTRA = "slidedp[trackers]"

# (module, the PyPI package that provides it) each tracker imports.
PACKAGES = {
    "tensorboard": [("tensorboard", "tensorboard")],
    "wandb": [("wandb", "wandb")],
    "mlflow": [("mlflow", "mlflow-skinny")],
}
# MLflow's local store is a SQLite file, read through SQLAlchemy and created by Alembic's migrations: MLflow 3
# refuses its older plain-file store unless told to use it anyway.
MLFLOW_LOCAL_STORE = [("sqlalchemy", "sqlalchemy"), ("alembic", "alembic")]


def requested(report_to: list[str] | None) -> list[str]:
    """The trackers a `report_to` value names, each once, in order; null is the default, TensorBoard."""
    if report_to is None:
        return ["tensorboard"]
    return [t for i, t in enumerate(report_to) if t != "none" and t not in report_to[:i]]


def missing_packages(tracker: str) -> list[str]:
    """The PyPI packages a tracker needs that this Python cannot import (found without importing them)."""
    needs = list(PACKAGES[tracker])
    if tracker == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        needs += MLFLOW_LOCAL_STORE
    return [package for module, package in needs if importlib.util.find_spec(module) is None]


def tensorboard_events(output_dir: str) -> bool:
    """Whether a job's output folder holds TensorBoard event files: what a reader of that folder would find, asked
    by the workbench before it points anyone at the folder (the default tracker writes none without its package)."""
    if not output_dir:
        return False
    try:
        return any(Path(output_dir, TENSORBOARD_DIR).glob(EVENTS_GLOB))
    except OSError:  # unreadable, or not a folder
        return False


def wandb_login_missing() -> str | None:
    """Why W&B would fail to start on this host, or None: it runs online (WANDB_MODE neither offline nor disabled)
    and finds no API key: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or the .netrc entry `wandb login` writes.
    Asked before a job is queued, as wandb.init would only fail once the job runs."""
    if os.environ.get("WANDB_MODE", "online").lower() in ("offline", "dryrun", "disabled"):
        return None
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    try:
        if netrc.netrc(os.environ.get("NETRC") or None).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass  # no .netrc, or one that says nothing
    return (f"names wandb, which logs in to {host} (WANDB_MODE is not offline) and finds no API key on this host: "
            "set WANDB_API_KEY or run `wandb login`, or set WANDB_MODE=offline to keep the run in local files")


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """A metrics record's numbers by name (nested keys and list positions joined with "/"), `step` left out."""
    out: dict[str, float] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{name}/{key}", item)
        elif isinstance(value, list):  # per GPU or per rank; a list of anything else (warnings) is text
            for i, item in enumerate(value):
                if isinstance(item, (int, float)):
                    walk(f"{name}/{i}", item)
        elif isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)

    for key, value in record.items():
        if key != "step":
            walk(key, value)
    return out


def config_params(cfg: JobConfig) -> dict[str, Any]:
    """The job config by dotted key; a list or null as its JSON text, so that every tracker takes each value."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix[:-1]] = value
        else:
            out[prefix[:-1]] = json.dumps(value)

    walk("", cfg.to_dict())
    return out


class Trackers:
    """The trackers of one job's attempt; see the module doc."""

    def __init__(self, cfg: JobConfig, start_step: int = 0, run_name: str | None = None,
                 on_log: Callable[[str], None] | None = None):
        self._on_log = on_log
        self._writers: list[Any] = []
        names = requested(cfg.report_to)
        if cfg.report_to is None and missing_packages("tensorboard"):  # validation refuses a named one
            self._say(f"no TensorBoard event files: the tensorboard package is not installed here (pip install "
                      f"'{EXTRA}' to have them)")
            names = []
        if not names:
            return
        out = os.path.abspath(cfg.output_dir)
        run_name = run_name or os.path.basename(out)
        state_path = os.path.join(out, STATE_FILE)
        state = _read_state(state_path) if start_step else {}  # a fresh run starts new W&B and MLflow runs
        params = config_params(cfg)
        for name in names:
            try:
                self._writers.append(WRITERS[name](out, start_step, run_name, params, state))
            except Exception as exc:  # a login, a server or a store that fails before the first step
                self.close("failed")
                raise ConfigError([{"loc": "report_to", "msg": f"{name} could not start: {type(exc).__name__}: "
                                    f"{exc}"}]) from exc
        if state:
            _write_state(state_path, state)
        self._say("reporting to " + "; ".join(w.where for w in self._writers))

    def _say(self, line: str) -> None:
        if self._on_log is not None:
            self._on_log(line)

    def log(self, record: dict[str, Any]) -> None:
        """Log one metrics record. A tracker that fails here is dropped, saying so: it does not stop training."""
        if not self._writers:
            return
        step, values = int(record["step"]), numbers(record)
        for writer in list(self._writers):
            try:
                writer.log(step, values)
            except Exception as exc:  # noqa: BLE001 - a tracker's server going away must not end a long run
                self._writers.remove(writer)
                self._say(f"{writer.name} stopped reporting at step {step}: {type(exc).__name__}: {exc}")
                _close_quietly(writer, "failed")

    def close(self, status: str) -> None:
        """End every tracker's run as `status` ("completed", "stopped" or "failed")."""
        writers, self._writers = self._writers, []
        for writer in writers:
            problem = _close_quietly(writer, status)
            if problem:
                self._say(f"{writer.name} did not close cleanly: {problem}")


def _close_quietly(writer: Any, status: str) -> str | None:
    try:
        writer.close(status)
    except Exception as exc:  # noqa: BLE001 - closing one tracker must not keep the others open
        return f"{type(exc).__name__}: {exc}"
    return None


def _read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(path: str, state: dict[str, Any]) -> None:
    atomic_file.write_json(path, state)


# ------------------------------------------------------------------------------------------------ the writers
class TensorBoardWriter:
    name = "tensorboard"

    def __init__(self, out: str, start_step: int, run_name: str, params: dict[str, Any], state: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        folder = os.path.join(out, TENSORBOARD_DIR)
        earlier = sorted(Path(folder).glob(EVENTS_GLOB))
        if start_step == 0:  # an earlier run's events would read as this run's
            for path in earlier:
                path.unlink()
        # purge_step: a reader drops what earlier files hold from this step on, as the resumed run logs it again
        self.writer = SummaryWriter(folder, purge_step=start_step + 1 if start_step else None, flush_secs=10)
        if start_step == 0 or not earlier:  # the config once, when the run begins (the HParams dashboard)
            for summary in hparams(params, {"loss": 0, "eval_loss": 0}):
                self.writer.file_writer.add_summary(summary)
        self.where = f"tensorboard: {folder} (tensorboard --logdir {shlex.quote(folder)})"

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self, status: str) -> None:
        self.writer.close()


class WandbWriter:
    name = "wandb"

    def __init__(self, out: str, start_step: int, run_name: str, params: dict[str, Any], state: dict[str, Any]):
        import wandb

        # WANDB_MODE (offline: no network), WANDB_API_KEY, WANDB_ENTITY and the rest are wandb's own to read.
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=os.environ.get("WANDB_NAME") or run_name,
            id=state.get("wandb_run_id"),  # None on a fresh run: W&B makes one
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else out,
            settings=wandb.Settings(console="off"),  # the job's output is the job log's, not a copy in W&B
        )
        self.run.config.update(params, allow_val_change=True)  # a resumed job may have changed a setting
        state["wandb_run_id"] = self.run.id
        self.where = f"wandb: run {self.run.id} of project {self.run.project} ({self.run.settings.mode})"

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=1 if status == "failed" else 0)


class MlflowWriter:
    name = "mlflow"
    STATUS = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}

    def __init__(self, out: str, start_step: int, run_name: str, params: dict[str, Any], state: dict[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        local = os.path.join(out, MLFLOW_DIR)
        own_store = not os.environ.get("MLFLOW_TRACKING_URI")
        if own_store:
            os.makedirs(local, exist_ok=True)
        uri = "sqlite:///" + os.path.join(local, "mlflow.db") if own_store else os.environ["MLFLOW_TRACKING_URI"]
        self.client = MlflowClient(tracking_uri=uri)
        kept = state.get("mlflow") or {}
        if kept.get("tracking_uri") == uri and kept.get("run_id"):
            self.run_id = kept["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
            found = self.client.get_experiment_by_name(experiment)
            artifacts = Path(local, "artifacts").as_uri() if own_store else None  # else the server's default
            eid = found.experiment_id if found else self.client.create_experiment(experiment, artifacts)
            self.run_id = self.client.create_run(eid, run_name=run_name).info.run_id
        # A param once logged cannot change: a resumed run keeps the values it began with.
        have = self.client.get_run(self.run_id).data.params
        new = [Param(key, str(value)) for key, value in params.items() if key not in have]
        for i in range(0, len(new), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=new[i:i + 100])
        state["mlflow"] = {"tracking_uri": uri, "run_id": self.run_id}
        self.where = f"mlflow: run {self.run_id} at {_without_password(uri)}"

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, self.STATUS[status])


def _without_password(uri: str) -> str:
    """A URI as a log line may show it: no user or password (the job log is shown in the UI)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


WRITERS = {"tensorboard": TensorBoardWriter, "wandb": WandbWriter, "mlflow": MlflowWriter}
