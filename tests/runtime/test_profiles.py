"""Declared hosts: the shipped hardware profiles load and validate, a bad profile names its field, a profile's
topology and derived calibration plan a real job with a step time marked as predicted from declared figures, the
cards order as their figures say, a gpu_memory_gib cap and a profile combine (the smaller wins), and the derivation
lands near what our H200 measured when it is fed that machine's datasheet figures."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
from slidedp import cli
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import profiles as pr
from slidedp.planning.job import GIB, Job, cap_budget
from slidedp.planning.topology import job_interconnect

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
EXPECTED = {"1x-rtx4090-128g", "2x-rtx4090-128g", "1x-rtx5090-128g", "1x-l40s-256g", "1x-rtx-a6000-128g",
            "1x-l4-64g"}


def job(gpus: int = 1, **over) -> JobConfig:
    raw = {"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": gpus, "micro_batch_size": 4, "seq_len": 2048}
    return JobConfig.from_dict({**raw, **over})


def declared_plan(name: str, cfg: JobConfig) -> dict:
    profile = pr.load(name)
    return ap.plan_job(cfg, pr.declared_topology(profile), pr.declared_calibration(cfg, profile))


def good_profile() -> dict:
    with open(os.path.join(pr.profile_dir(), "1x-rtx4090-128g.json")) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def rtx4090_plan():
    return declared_plan("1x-rtx4090-128g", job())


# ---------------------------------------------------------------------------- the files
def test_every_shipped_profile_loads_with_a_source_for_each_figure():
    assert EXPECTED <= set(pr.shipped())
    for name in pr.shipped():
        p = pr.load(name)
        assert p["name"] == name and p["source"] == "shipped"
        assert set(pr.FIGURES) <= set(p["sources"])
        s = pr.summary(p)
        assert s["gpu_memory_gib"] >= 24 and s["host_ram_gib"] >= 64
    two = pr.load("2x-rtx4090-128g")["gpus"]
    assert two["count"] == 2 and two["p2p"] is False
    assert pr.load("1x-rtx5090-128g")["gpus"]["pcie_gen"] == 5 and pr.load("1x-rtx5090-128g")["gpus"]["hbm_gib"] == 32


def test_profiles_ship_as_package_data():
    root = os.path.dirname(os.path.dirname(os.path.dirname(FIX)))
    with open(os.path.join(root, "pyproject.toml")) as fh:
        text = fh.read()
    assert 'slidedp = ["assets/**/*"]' in text  # setuptools package-data: assets/profiles/*.json included
    assert pr.profile_dir().endswith(os.path.join("slidedp", "assets", "profiles"))


@pytest.mark.parametrize(
    ("change", "field", "advice"),
    [
        (lambda p: p["gpus"].pop("hbm_gib"), "gpus.hbm_gib: missing", "give a number"),
        (lambda p: p["gpus"].update(pcie_gen=9), "gpus.pcie_gen: 9 is not usable", "from 1 to 6"),
        (lambda p: p["gpus"].update(count=1.5), "gpus.count: 1.5 is not usable", "a whole number"),
        (lambda p: p["gpus"].update(p2p="no"), "gpus.p2p: missing", "false when collectives go through host"),
        (lambda p: p["host"].update(ram_gib="128"), "host.ram_gib: '128' is not usable", "give a number"),
        (lambda p: p.pop("host"), "host: missing", "ram_gib, cores, dram_gbps"),
        (lambda p: p["sources"].pop("host.dram_gbps"), "sources: no note for host.dram_gbps", "where each"),
        (lambda p: p["gpus"].update(tflops=1), "gpus: unknown field(s) tflops", "bf16_dense_tflops"),
        (lambda p: p.update(name="My Box"), "name: missing or not a short lower-case name", "e.g."),
    ],
)
def test_a_bad_profile_names_its_field_and_the_fix(tmp_path, change, field, advice):
    raw = good_profile()
    change(raw)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(pr.ProfileError) as err:
        pr.load(str(path))
    problem = next(p for p in err.value.problems if p.startswith(field.split(":")[0]))
    assert problem.startswith(field) and advice in problem
    assert str(path) in str(err.value)


def test_a_users_own_profile_file_loads_and_a_missing_one_names_the_shipped(tmp_path):
    raw = good_profile()
    raw["name"], raw["gpus"]["hbm_gib"] = "my-4090", 24
    path = tmp_path / "my.json"
    path.write_text(json.dumps(raw))
    assert pr.load(str(path))["source"] == str(path)
    with pytest.raises(pr.ProfileError, match="1x-l40s-256g"):
        pr.load(str(tmp_path / "absent.json"))
    with pytest.raises(pr.ProfileError, match="never|no shipped profile"):
        pr.load(str(path), allow_path=False)  # what the web API calls: a path is never opened
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(pr.ProfileError, match="cannot be read as JSON"):
        pr.load(str(tmp_path / "broken.json"))


# ---------------------------------------------------------------------------- topology and calibration
def test_a_declared_topology_has_the_detected_shape_and_says_it_is_declared():
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        detected = json.load(fh)["nvlink"]  # what detect() reported on our two-GPU machine
    topo = pr.declared_topology(pr.load("2x-rtx4090-128g"))
    assert set(detected) - {"source"} <= set(topo)
    assert set(detected["gpus"][0]) <= set(topo["gpus"][0]) and set(detected["cpu"]) <= set(topo["cpu"])
    assert topo["declared"]["profile"] == "2x-rtx4090-128g"
    assert [g["hbm_bytes"] for g in topo["gpus"]] == [24 * GIB, 24 * GIB]
    assert topo["gpus"][0]["pcie"]["gen"] == 4 and topo["gpus"][0]["pcie"]["width"] == 8
    assert job_interconnect(topo, 2) == "pcie-host"  # no peer-to-peer: collectives through host memory
    j = Job.from_config(job(gpus=2), topo)
    assert j.hbm_bytes == 24 * GIB and j.host_limit_bytes == 128 * GIB and j.cores == 32


def test_every_figure_of_a_declared_calibration_is_declared_or_derived():
    cfg = job(gpus=2)
    calib = pr.declared_calibration(cfg, pr.load("2x-rtx4090-128g"))
    assert calib["declared"]["profile"] == "2x-rtx4090-128g" and "created_at" not in calib
    figures = {"cpu", "update_in_step", "host_dram", "transfers", "device_update", "unit", "embedding",
               "loss_head", "collectives"}
    assert figures <= set(calib["provenance"])
    assert {v["kind"] for v in calib["provenance"].values()} == {"declared", "derived"}
    # the link and the host from the declared figures: Gen4 x8 at PCIE_COPY_EFFICIENCY, no P2P
    assert calib["transfers"]["h2d_GBps"][-1] == pytest.approx(1.969 * 8 * pr.PCIE_COPY_EFFICIENCY, rel=0.01)
    assert calib["host_dram"]["capacity_GBps"] == pytest.approx(76.8 * pr.DRAM_EFFICIENCY)
    big = calib["collectives"]["all_gather"][-1]
    assert big["bytes"] / 2 / (big["s"] - pr.COLLECTIVE_LATENCY_S) / 1e9 == pytest.approx(
        1.969 * 8 * pr.PCIE_COPY_EFFICIENCY * pr.COLLECTIVE_VIA_HOST_FRACTION, rel=0.01)
    # the host update, DRAM-bound at every thread count of a 32-CPU desktop: 34 B/param over 70% of 76.8 GB/s
    assert calib["cpu"]["update_s_per_1e9"][-1] == pytest.approx(34 / (76.8 * 0.7), rel=0.01)


def test_a_cpu_job_cannot_be_planned_on_a_declared_gpu_host():
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "gpus": 0})
    errors = pr.job_errors(cfg, pr.load("1x-l4-64g"))
    assert [e["loc"] for e in errors] == ["gpus"]
    with pytest.raises(pr.ProfileError, match="CPU job"):
        pr.declared_calibration(cfg, pr.load("1x-l4-64g"))


# ---------------------------------------------------------------------------- plans
def test_qwen3_4b_plans_on_a_declared_4090_with_a_predicted_step(rtx4090_plan):
    plan = rtx4090_plan
    assert plan["feasible"] is True
    assert plan["calibration"] == "declared" and "not measured" in plan["calibration_note"]
    assert plan["declared"]["profile"] == "1x-rtx4090-128g"
    assert plan["job"]["activation_sizes"] == "estimated (declared host)"
    pred = plan["predicted"]
    assert 0.5 < pred["step_time_s"] < 30
    assert pred["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"] < 24
    text = ap.format_plan(plan)
    assert text.splitlines()[0].startswith("DECLARED HOST: 1x-rtx4090-128g")
    assert "not measured here" in text.splitlines()[1]


def test_a_4090_predicts_a_slower_step_than_an_l40s(rtx4090_plan):
    l40s = declared_plan("1x-l40s-256g", job())
    assert l40s["feasible"] is True
    assert rtx4090_plan["predicted"]["step_time_s"] > 1.3 * l40s["predicted"]["step_time_s"]


def test_gpu_memory_gib_and_a_profile_plan_on_the_smaller_of_the_two():
    capped = declared_plan("1x-l40s-256g", job(gpu_memory_gib=24))
    assert capped["feasible"] is True
    assert capped["job"]["hbm_budget_gib"] == pytest.approx(cap_budget(24 * GIB) / GIB)
    assert capped["predicted"]["hbm_peak_gib"] <= capped["job"]["hbm_budget_gib"]
    # a cap above the declared card: the card's budget holds
    wide = Job.from_config(job(gpu_memory_gib=80), pr.declared_topology(pr.load("1x-rtx4090-128g")))
    assert wide.hbm_budget == int(24 * GIB * 0.92)


def test_the_derivation_fed_our_h200s_figures_lands_near_what_it_measured():
    """The assumptions come from this machine: its datasheet figures (989 dense BF16 TFLOPS, 4.8 TB/s, Gen5 x16)
    must give layer times and a step near its own calibration's."""
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        fixture = json.load(fh)
    measured, topo = fixture["calibration_qwen3-1.7b_bs8_schema5"], fixture["topology"]
    h200 = pr.validate({
        "name": "h200", "description": "our development machine",
        "gpus": {"count": 1, "name": "NVIDIA H200", "hbm_gib": 140, "hbm_gbps": 4800, "bf16_dense_tflops": 989,
                 "pcie_gen": 5, "pcie_width": 16, "p2p": False},
        "host": {"ram_gib": 128, "cores": 16, "dram_gbps": 180},
        "sources": {f: "test" for f in pr.FIGURES},
    })
    cfg = JobConfig.from_dict({"model": "qwen3-1.7b", "data": {"path": "x.jsonl"}, "gpus": 1,
                               "micro_batch_size": 8, "seq_len": 2048})
    derived = pr.declared_calibration(cfg, h200)
    for key in ("fwd_keep_s", "bwd_keep_s", "bwd_checkpoint_s", "saved_keep_bytes"):
        assert 0.75 < derived["unit"][key] / measured["unit"][key] < 1.3, key
    assert 0.8 < derived["transfers"]["h2d_GBps"][2] / measured["transfers"]["h2d_GBps"][2] < 1.2
    assert 0.7 < derived["loss_head"]["s_per_token"] / measured["loss_head"]["s_per_token"] < 1.4
    step = ap.plan_job(cfg, pr.declared_topology(h200), derived)["predicted"]["step_time_s"]
    real = ap.plan_job(cfg, topo, measured)["predicted"]["step_time_s"]
    assert 0.75 < step / real < 1.3


# ---------------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_plan_with_a_profile_reports_the_declared_host_and_never_measures_here(tmp_path, monkeypatch, capsys):
    def refuse(*a, **k):
        raise AssertionError("a declared plan must not detect or calibrate this host")

    fake = types.ModuleType("slidedp.planning.calibration")
    fake.load_or_calibrate = refuse
    monkeypatch.setitem(sys.modules, "slidedp.planning.calibration", fake)
    monkeypatch.setattr("slidedp.planning.calibration", fake, raising=False)
    monkeypatch.setattr("slidedp.planning.topology.detect", refuse)
    data = tmp_path / "x.jsonl"
    data.write_text('{"text": "hello"}\n')
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"model": "qwen3-4b", "data": {"path": str(data)}, "gpus": 1,
                                  "micro_batch_size": 4, "seq_len": 2048}))
    assert cli.main(["plan", "--config", str(config), "--profile", "1x-rtx5090-128g"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("DECLARED HOST: 1x-rtx5090-128g") and "not measured here" in out[1]
    assert any(line.startswith("predicted: ") and "s/step" in line for line in out)
    # a profile file of one's own; a bad one is exit 2 naming the field
    raw = good_profile()
    raw["gpus"].pop("pcie_width")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    assert cli.main(["plan", "--config", str(config), "--profile", str(bad)]) == 2
    assert "gpus.pcie_width: missing" in capsys.readouterr().err
    assert cli.main(["plan", "--config", str(config), "--profile", "1x-rtx4090-128g", "--set",
                     "host_ram_gib=500"]) == 2
    assert "host_ram_gib: 500 GiB is more than the 128 GiB" in capsys.readouterr().err


def test_profiles_are_listed_by_both_commands(capsys):
    assert cli.main(["profiles"]) == 0
    listed = capsys.readouterr().out
    assert cli.main(["plan", "--profiles"]) == 0
    assert capsys.readouterr().out == listed
    for name in pr.shipped():
        assert name in listed
