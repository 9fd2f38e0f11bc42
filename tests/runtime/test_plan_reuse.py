"""A plan records its basis (the host facts and the calibration it was made on); slidedp.train(config, plan=p) runs
with p when the basis it sees now is p's, and otherwise plans again and says why (tiny model, CPU: the run
calibrates this host for the job's shape, cached, so a plan made here is made on that calibration)."""

from __future__ import annotations

import copy
import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import slidedp  # noqa: E402
from slidedp import launch  # noqa: E402
from slidedp.config import JobConfig  # noqa: E402
from slidedp.planning import autopolicy, calibration, topology  # noqa: E402
from slidedp.presets import PRESETS  # noqa: E402

LAYERS = PRESETS["tiny-qwen3"]["num_hidden_layers"]
GIB = 2**30


def _cfg(**over) -> JobConfig:
    raw = {"model": "tiny-qwen3", "data": {"path": "x.jsonl", "format": "tokens"}, "gpus": 0, "ranks": 1,
           "micro_batch_size": 2, "seq_len": 32, "precision": "fp32"}
    raw.update(over)
    return JobConfig.from_dict(raw)


@pytest.fixture(autouse=True, scope="module")
def _calibration_cache(tmp_path_factory):
    """This module's calibrations in a folder of its own (measured once per shape, then read from it)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SLIDEDP_CACHE_DIR", str(tmp_path_factory.mktemp("calibration")))
        yield


def _calibration(cfg: JobConfig, topo: dict) -> dict:
    """The calibration a run of cfg on this host plans with (slidedp.launch.resolve_policy loads the same)."""
    return calibration.load_or_calibrate(cfg, topo)


def _refuse_planning(monkeypatch) -> None:
    def planned_again(*_a, **_k):
        raise AssertionError("plan_job was called: the stored plan should have been used")

    monkeypatch.setattr(autopolicy, "plan_job", planned_again)


def test_one_host_detected_twice_gives_one_basis():
    cfg = _cfg()
    first, second = topology.detect(), topology.detect()
    a, b = autopolicy.plan_job(cfg, first, None), autopolicy.plan_job(cfg, second, None)
    assert a["basis"] == b["basis"]
    assert set(a["basis"]) >= {"topology", "calibration"} and a["basis"]["calibration"] is None
    assert len(a["basis"]["topology"]) == 16 and int(a["basis"]["topology"], 16) >= 0
    # What a worker stores and reads back (JSON), and what changes between two reports, leave it as it is.
    stored = json.loads(json.dumps(first))
    stored["shm"] = {**stored["shm"], "free_bytes": 12345}
    stored["hostname"] = "renamed"
    stored["software"] = {**stored["software"], "torch": "0.0"}
    stored["notes"] = ["another note"]
    assert autopolicy.plan_basis(cfg, stored, None) == a["basis"]
    # The refusals carry one as well.
    refused = autopolicy.plan_job(_cfg(gpus=8), first, None)
    assert refused["feasible"] is False and refused["basis"]["topology"]


def test_a_host_ram_limit_or_cpu_count_changes_the_basis():
    cfg = _cfg()
    four, eight = topology.detect(host_ram_gib=4.0), topology.detect(host_ram_gib=8.0)
    basis4 = autopolicy.plan_job(cfg, four, None)["basis"]
    basis8 = autopolicy.plan_job(cfg, eight, None)["basis"]
    assert basis4["topology"] != basis8["topology"]
    assert autopolicy.basis_change(basis4, basis8) == "the host's RAM limit changed since the job was planned"

    more_cores = copy.deepcopy(four)
    more_cores["cpu"]["cores"] = int(four["cpu"]["cores"] or 1) + 3
    basis_cores = autopolicy.plan_job(cfg, more_cores, None)["basis"]
    assert basis_cores["topology"] != basis4["topology"]
    assert autopolicy.basis_change(basis4, basis_cores) == "the host's CPU cores changed since the job was planned"

    gpu = {"index": 0, "name": "NVIDIA H200", "hbm_bytes": 140 * GIB}
    with_gpu = {**four, "gpus": [gpu]}
    assert autopolicy.basis_change(basis4, autopolicy.plan_basis(cfg, with_gpu, None)) == (
        "the host's GPUs changed since the job was planned")
    # A job that sets its own host_ram_gib plans against that figure: the host's own limit is not part of it.
    own = _cfg(host_ram_gib=2.0)
    assert autopolicy.plan_basis(own, four, None) == autopolicy.plan_basis(own, eight, None)


def test_the_calibration_is_part_of_the_basis():
    cfg, topo = _cfg(), topology.detect()
    entry = {"created_at": "2025-01-01T00:00:00+00:00", "key": "k", "shape": {"micro_batch": 2}, "world": 1,
             "device": "cpu", "quick": True, "cpu": {"adamw_s_per_1e9": 1.0}}
    none = autopolicy.plan_basis(cfg, topo, None)
    one = autopolicy.plan_basis(cfg, topo, entry)
    assert none["topology"] == one["topology"] and none["calibration"] is None and one["calibration"]
    assert autopolicy.plan_basis(cfg, topo, json.loads(json.dumps(entry))) == one
    again = autopolicy.plan_basis(cfg, topo, {**entry, "created_at": "2025-02-01T00:00:00+00:00"})
    assert again["calibration"] != one["calibration"]
    assert autopolicy.basis_change(none, one) == "a calibration for this shape exists now"
    assert autopolicy.basis_change(one, again) == "the calibration for this shape changed since the job was planned"
    assert autopolicy.basis_change(one, none) == "the job was planned with a calibration this run does not use"
    assert autopolicy.basis_change(None, one) == "the stored plan has no basis"
    assert autopolicy.basis_change(one, one) is None


def test_resolve_policy_uses_a_stored_plan_only_on_its_basis(monkeypatch):
    cfg = _cfg()
    topo = topology.detect()
    plan = autopolicy.plan_job(cfg, topo, _calibration(cfg, topo))
    plan["policy"] = {**plan["policy"], "window": 5}  # a choice the planner would not make here
    lines: list[str] = []
    with monkeypatch.context() as m:
        _refuse_planning(m)
        policy, used = launch.resolve_policy(cfg, LAYERS, lines.append, plan)
    assert policy.window == 5 and used == plan and "replanned" not in used
    assert not any(line.startswith(("re-planned", "planner unavailable")) for line in lines), lines

    # No stored plan (the CLI): planned as before, nothing said about re-planning (the calibration is cached).
    lines.clear()
    policy, used = launch.resolve_policy(cfg, LAYERS, lines.append)
    assert policy.window == 3 and "replanned" not in used and lines == []
    assert used["calibration"] == "measured" and used["predicted"]["step_time_s"] > 0

    # A plan made before this host had a calibration: planned again, with it.
    bare = autopolicy.plan_job(cfg, topo, None)
    lines.clear()
    policy, used = launch.resolve_policy(cfg, LAYERS, lines.append, bare)
    assert used["replanned"] == "a calibration for this shape exists now" and used["calibration"] == "measured"

    # Without a basis, for another model depth: planned again, and said why.
    for stored, why in (({k: v for k, v in plan.items() if k != "basis"}, "the stored plan has no basis"),
                        ({**plan, "job": {**plan["job"], "layers": LAYERS + 2}},
                         f"the stored plan is for 1 rank(s) and {LAYERS + 2} layers, this run has 1 and {LAYERS}")):
        lines.clear()
        policy, used = launch.resolve_policy(cfg, LAYERS, lines.append, stored)
        assert policy.window == 3 and used["replanned"] == why and lines == [f"re-planned: {why}"]


def _train_cfg(tmp_path, name: str) -> JobConfig:
    data = tmp_path / "tokens.jsonl"
    if not data.exists():
        rows = [{"input_ids": [3 + (7 * r + i) % 500 for i in range(32)]} for r in range(8)]
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return _cfg(data={"path": str(data), "format": "tokens"}, steps=1, export=False, cpu_threads=1,
                output_dir=str(tmp_path / name))


@pytest.mark.slow
def test_train_runs_a_stored_plan_made_on_this_host_without_planning(tmp_path, monkeypatch):
    cfg = _train_cfg(tmp_path, "reused")
    topo = topology.detect()
    plan = autopolicy.plan_job(cfg, topo, _calibration(cfg, topo))
    plan["policy"] = {**plan["policy"], "window": 4}
    _refuse_planning(monkeypatch)
    lines: list[str] = []
    result = slidedp.train(cfg, on_log=lines.append, plan=plan)
    assert result.status == "completed" and result.steps_done == 1
    assert result.policy.window == 4
    assert result.plan == plan and "replanned" not in result.plan
    assert "plan reused: this host and calibration are the ones it was made on" in lines
    assert not any(line.startswith(("re-planned", "planner unavailable")) for line in lines), lines


def test_train_plans_again_when_the_host_changed_and_says_why(tmp_path):
    cfg = _train_cfg(tmp_path, "replanned")
    now = topology.detect()
    elsewhere = {**now, "host_ram": {**now["host_ram"], "limit_bytes": now["host_ram"]["limit_bytes"] // 2}}
    calib = _calibration(cfg, now)
    plan = autopolicy.plan_job(cfg, elsewhere, calib)
    plan["policy"] = {**plan["policy"], "window": 4}
    lines: list[str] = []
    result = slidedp.train(cfg, on_log=lines.append, plan=plan)
    why = "the host's RAM limit changed since the job was planned"
    assert result.status == "completed"
    assert result.plan["replanned"] == why and f"re-planned: {why}" in lines
    assert result.plan["basis"] == autopolicy.plan_basis(cfg, now, calib) != plan["basis"]
    assert result.policy.window == 3  # the new plan's, not the stale one's


@pytest.mark.parametrize("stored", [None, {}])
def test_train_without_a_usable_stored_plan_still_plans(tmp_path, stored):
    cfg = _train_cfg(tmp_path, f"plain-{stored is None}")
    lines: list[str] = []
    result = slidedp.train(cfg, on_log=lines.append, plan=stored)
    assert result.status == "completed" and result.plan["feasible"] is True and result.plan["basis"]
    if stored is None:
        assert "replanned" not in result.plan and not any(line.startswith("re-planned") for line in lines)
    else:
        assert result.plan["replanned"] == "the stored plan has no basis"
