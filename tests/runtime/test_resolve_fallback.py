"""A run without a plan says so: a host that cannot be measured runs the configured policy with the reason
recorded in the plan (`fallback`) and logged; an error of the planner itself stops the run instead of being
replaced by the configured policy."""

from __future__ import annotations

import logging

import pytest
from slidedp import launch
from slidedp.config import JobConfig
from slidedp.planning import autopolicy
from slidedp.presets import PRESETS

LAYERS = PRESETS["tiny-qwen3"]["num_hidden_layers"]


def _cfg() -> JobConfig:
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "gpus": 0, "ranks": 1,
                                "micro_batch_size": 2, "seq_len": 32,
                                "policy": {"activations": "auto", "keep_layers": 1}})


def test_a_planner_error_stops_the_run_instead_of_the_configured_policy(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "cache"))

    def buggy(*_a, **_k):
        raise KeyError("hbm_bytes")

    monkeypatch.setattr(autopolicy, "plan_job", buggy)
    lines: list[str] = []
    with pytest.raises(KeyError, match="hbm_bytes"):
        launch.resolve_policy(_cfg(), LAYERS, lines.append)
    assert not any("planner unavailable" in line for line in lines), lines


def test_a_host_that_cannot_be_measured_runs_the_configured_policy_and_says_why(monkeypatch, tmp_path, caplog):
    # The calibration cache is a file, not a folder: the measured calibration cannot be saved (a real OSError).
    blocked = tmp_path / "cache"
    blocked.write_text("not a folder")
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(blocked / "inner"))
    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="slidedp.planning.resolve"):
        policy, plan = launch.resolve_policy(_cfg(), LAYERS, lines.append)
    assert set(plan) == {"fallback"}, plan  # no prediction, no plan policy: only the recorded decision
    reason = plan["fallback"]["reason"]
    assert reason.startswith(("NotADirectoryError", "FileExistsError")) and str(blocked) in reason, reason
    assert plan["fallback"]["policy"] == policy.to_dict()
    assert policy.activations == ("keep",) + ("checkpoint",) * (LAYERS - 1)  # the configured keep_layers: 1
    assert any(line.startswith("planner unavailable (") and reason in line for line in lines), lines
    assert any(reason in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
