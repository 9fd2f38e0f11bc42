"""A saved host (slidedp topology --save) plans elsewhere as the host itself would: the round trip on this machine
gives the plan planning here gives, the shipped two-H200 figures plan Qwen3-8B with their own calibration, and a
file that is not a saved host is refused with what is wrong."""

import json
import os

import pytest
from slidedp import cli
from slidedp.planning import host_file

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _job(tmp_path, **keys):
    job = tmp_path / "job.json"
    cpu = {"gpus": 0, "ranks": 1, "cpu_threads": 1}
    job.write_text(json.dumps({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "micro_batch_size": 2,
                               "seq_len": 32, **(cpu if "gpus" not in keys else {}), **keys}))
    return str(job)


def _plan_json(capsys, *argv):
    assert cli.main(["plan", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_host_saved_here_plans_as_planning_here_does(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "cache"))
    job = _job(tmp_path)
    here = _plan_json(capsys, "--config", job)  # calibrates this host at the job's shape, and caches it
    assert here["calibration"] == "measured" and here["predicted"]["step_time_s"] > 0

    saved = tmp_path / "host.json"
    assert cli.main(["topology", "--save", str(saved)]) == 0
    assert "1 calibration(s)" in capsys.readouterr().out
    data = json.loads(saved.read_text())
    assert data["kind"] == "slidedp-host" and data["name"] == data["topology"]["hostname"]
    assert len(data["calibrations"]) == 1 and data["calibrations"][0]["shape"]["seq"] == 32

    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "elsewhere"))  # nothing measured on "this" machine
    there = _plan_json(capsys, "--config", job, "--host", str(saved))
    imported = there.pop("imported_host")
    assert imported["name"] == data["name"] and imported["saved_at"] == data["saved_at"]
    assert there == here
    assert not os.path.exists(tmp_path / "elsewhere")  # planning for the saved host measured nothing here

    assert cli.main(["plan", "--config", job, "--host", str(saved)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"planned for the imported host {data['name']} from {saved}, saved {data['saved_at'][:10]}"


def test_the_saved_two_h200_host_plans_qwen3_8b_with_its_own_calibration(tmp_path, capsys):
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        topo = json.load(fh)["nvlink"]
    with open(os.path.join(FIX, "h200x2_calibration.json")) as fh:
        cals = list(json.load(fh).values())
    path = tmp_path / "h200x2.json"
    host_file.save(str(path), host_file.build(topo, cals))
    plan = _plan_json(capsys, "--config", _job(tmp_path, model="qwen3-8b", gpus=2, micro_batch_size=8,
                                                seq_len=2048), "--host", str(path))
    assert plan["feasible"] and plan["calibration"] == "measured"
    assert plan["policy"]["grad_reduce"] == "gpu" and plan["predicted"]["step_time_s"] > 0
    assert plan["imported_host"]["name"] == topo["hostname"]


@pytest.mark.parametrize("content, says", [
    ("not json", "is not JSON"),
    (json.dumps({"gpus": []}), 'needs "kind": "slidedp-host"'),
    (json.dumps({"kind": "slidedp-host", "schema": 1, "name": "h", "saved_at": "2026-01-01", "topology": {},
                 "calibrations": []}), '"topology" must be'),
    (json.dumps({"kind": "slidedp-host", "schema": 1, "name": "h", "saved_at": "2026-01-01",
                 "topology": {"gpus": [], "cpu": {}}, "calibrations": [{"device": "tpu"}]}), "calibrations[0]"),
])
def test_a_file_that_is_not_a_saved_host_is_refused_with_what_is_wrong(tmp_path, capsys, content, says):
    path = tmp_path / "host.json"
    path.write_text(content)
    assert cli.main(["plan", "--config", _job(tmp_path), "--host", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--host: ") and says in err, err
