from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from slidedp import trackers

from slidedp_web.models import PresetList
from slidedp_web.presets import form_presets

router = APIRouter(prefix="/presets", tags=["presets"])

# What each tracker of config `report_to` needs besides its package, in words for the job form.
TRACKER_NEEDS = {
    "tensorboard": "Nothing else: event files in the job's output folder, read with `tensorboard --logdir`.",
    "wandb": "A Weights & Biases API key on the host that runs the job (WANDB_API_KEY or `wandb login`), or "
             "WANDB_MODE=offline to keep the run in local files.",
    "mlflow": "MLFLOW_TRACKING_URI for a tracking server, else a local store (SQLite) in the job's output folder.",
}
TRACKER_LABELS = {"tensorboard": "TensorBoard", "wandb": "Weights & Biases", "mlflow": "MLflow"}


class TrackerInfo(BaseModel):
    """One experiment tracker as this server finds it (the job form's checkboxes for `report_to`)."""

    name: str  # the value report_to takes
    label: str
    installed: bool  # this server's Python imports its packages (validation asks the same)
    missing: list[str]  # the PyPI packages it lacks here
    needs: str  # what else it needs, in words
    problem: str | None = None  # why it would fail to start here now (W&B online without an API key), else null


class FormPresets(PresetList):
    trackers: list[TrackerInfo]


def tracker_info() -> list[TrackerInfo]:
    out = []
    for name in trackers.PACKAGES:
        missing = trackers.missing_packages(name)
        problem = trackers.wandb_login_missing() if name == "wandb" and not missing else None
        out.append(TrackerInfo(name=name, label=TRACKER_LABELS.get(name, name), installed=not missing,
                               missing=missing, needs=TRACKER_NEEDS.get(name, ""), problem=problem))
    return out


@router.get("", response_model=FormPresets)
def list_presets() -> FormPresets:
    """Complete job configs the job form starts from, and the experiment trackers this server can run."""
    return FormPresets(items=form_presets(), trackers=tracker_info())
