"""GET /api/presets says which experiment trackers (config `report_to`) this server can run, for the job form's
checkboxes: each tracker's package installed or not (what validation asks too), what else it needs, and why W&B
would not start here now. Against the real API over HTTP."""

from __future__ import annotations

import sys

import httpx
import pytest

pytest.importorskip("tensorboard", reason="the web extra installs tensorboard")


def test_presets_name_each_tracker_and_whether_its_package_is_installed(api, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as on a server without the trackers extra
    monkeypatch.setenv("WANDB_MODE", "offline")
    body = httpx.get(api.url + "/api/presets", timeout=30).json()
    assert body["items"]  # the presets are still there
    by_name = {t["name"]: t for t in body["trackers"]}
    assert list(by_name) == ["tensorboard", "wandb", "mlflow"]
    assert by_name["tensorboard"]["installed"] is True and by_name["tensorboard"]["missing"] == []
    assert by_name["tensorboard"]["label"] == "TensorBoard"
    assert by_name["mlflow"]["installed"] is False and "mlflow-skinny" in by_name["mlflow"]["missing"]
    assert "MLFLOW_TRACKING_URI" in by_name["mlflow"]["needs"]
    if by_name["wandb"]["installed"]:
        assert by_name["wandb"]["problem"] is None  # offline: no key needed
        monkeypatch.setenv("WANDB_MODE", "online")
        for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("NETRC", "/nonexistent/.netrc")
        wandb = {t["name"]: t for t in httpx.get(api.url + "/api/presets", timeout=30).json()["trackers"]}["wandb"]
        assert "WANDB_API_KEY" in wandb["problem"]
