"""A workbench's calibrations are its own: its jobs cache them under its data folder, its Hosts listing shows only
those, and a record measured on other hardware is neither listed nor used for this host (real runtime processes
calibrating a tiny model on the CPU, a real worker reporting to the real API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from backend_support import ApiServer, WorkerProcess, make_settings, wait_for

pytestmark = pytest.mark.timeout(240)


def _calibrate(folder: Path, seq_len: int, env: dict[str, str]) -> tuple[dict, str]:
    """Plan a tiny CPU job's calibration with the runtime (quick), as a job process would; (record, stderr)."""
    job, data = folder.parent / f"job-{seq_len}.yaml", folder.parent / "tokens.jsonl"
    data.write_text(json.dumps({"input_ids": list(range(seq_len + 1))}) + "\n")
    job.write_text(json.dumps({"model": "tiny-qwen3", "data": {"path": str(data), "format": "tokens"}, "gpus": 0,
                               "ranks": 1, "seq_len": seq_len, "micro_batch_size": 2, "steps": 1,
                               "precision": "fp32"}))
    done = subprocess.run([sys.executable, "-m", "slidedp.planning.calibration", str(job), "--quick"],
                          env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """A user whose CLI (or another workbench) has calibrated this host before, in ~/.cache/slidedp/calibration."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLIDEDP_CACHE_DIR", raising=False)
    monkeypatch.delenv("SLIDEDP_CALIBRATION_DIR", raising=False)
    shared = tmp_path / "home" / ".cache" / "slidedp" / "calibration"
    shared.mkdir(parents=True)
    _calibrate(shared, 32, {**os.environ, "SLIDEDP_CACHE_DIR": str(shared)})
    return tmp_path / "home"


@pytest.mark.slow
def test_a_workbench_lists_only_the_calibrations_made_under_its_data_folder(tmp_path, home, redis_server):
    settings = make_settings(tmp_path / "data", redis_server.url)
    own_dir = (tmp_path / "data" / "calibration").resolve()
    assert settings.calibration_path == own_dir and settings.env()["SLIDEDP_CACHE_DIR"] == str(own_dir)
    own, log = _calibrate(tmp_path / "data", 64, {**os.environ, **settings.env()})  # the job process's env
    assert f"cached in {own_dir}/" in log
    # the same host name on other hardware (a copied cache, or containers of one name): not this host's
    elsewhere = {**own, "shape": {**own["shape"], "seq": 128}, "host_digest": "0123456789abcdef"}
    (own_dir / f"{own['host']}-elsewhere.json").write_text(json.dumps(elsewhere))
    shared = list((home / ".cache" / "slidedp" / "calibration").glob("*.json"))
    assert len(shared) == 1 and json.loads(shared[0].read_text())["shape"]["seq"] == 32

    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as client:
        worker = WorkerProcess(settings, tmp_path / "worker.log").start()
        try:
            def reported():
                for h in client.get("/api/hosts").json()["items"]:
                    if h["name"] == settings.host_name and h["calibration"]:
                        return h["calibration"]
                return None

            calibration = wait_for(reported, 60, "the worker to report its calibrations")
        finally:
            worker.stop()
    assert calibration["dir"] == str(own_dir)
    assert [(e["shape"]["seq"], e["host_digest"]) for e in calibration["entries"]] == [(64, own["host_digest"])]


@pytest.mark.slow
def test_a_record_measured_on_other_hardware_is_measured_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**os.environ, "SLIDEDP_CACHE_DIR": str(cache)}
    first, log = _calibrate(cache, 32, env)
    assert "calibrating this host" in log
    [path] = cache.glob("*.json")
    again, log = _calibrate(cache, 32, env)  # this host's own record: read from the cache
    assert "calibrating this host" not in log and again["created_at"] == first["created_at"]
    path.write_text(json.dumps({**first, "host_digest": "0123456789abcdef", "created_at": "2020-01-01T00:00:00"}))
    fresh, log = _calibrate(cache, 32, env)
    assert "calibrating this host" in log and fresh["host_digest"] == first["host_digest"]
    assert json.loads(path.read_text())["host_digest"] == first["host_digest"]


def test_a_record_without_a_digest_is_judged_by_the_host_and_gpu_it_names():
    from slidedp.planning.host_identity import host_digest, measured_on

    topology = {"hostname": "node-a", "cpu": {"model": "Xeon", "cores": 32, "logical_cpus": 64},
                "gpus": [{"name": "NVIDIA H200", "hbm_bytes": 150 * 2**30, "uuid": "GPU-1"}]}
    assert measured_on({"host": "node-a", "gpu_name": "NVIDIA H200"}, topology)
    assert not measured_on({"host": "node-b", "gpu_name": "NVIDIA H200"}, topology)
    assert not measured_on({"host": "node-a", "gpu_name": "NVIDIA A100"}, topology)
    swapped = {**topology, "gpus": [{"name": "NVIDIA H200", "hbm_bytes": 150 * 2**30, "uuid": "GPU-2"}]}
    assert measured_on({"host_digest": host_digest(topology)}, topology)
    assert not measured_on({"host_digest": host_digest(topology)}, swapped)
    # what a host reports differently from one report to the next does not make it another host
    limited = {**topology, "host_ram": {"limit_bytes": 2**30}, "shm": {"free_bytes": 5}}
    assert host_digest(limited) == host_digest(topology)
