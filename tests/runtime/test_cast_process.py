"""The host cast planned in a process of its own (slidedp/planning/cast_process.py): the plan is the one planned in
one process, whether that process answers, dies or never starts; train() ends it on every path; it is started only
where both casts are searched."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
from slidedp.config import ConfigError, JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import cast_process
from slidedp.planning.cast_process import CastProcess
from slidedp.planning.resolve import early_cast_process

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture(scope="module")
def host():
    """The one-H200 machine's topology and its Qwen3-4B micro-batch-4 calibration."""
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    with open(os.path.join(FIX, "h200x1_measured_hbm.json")) as fh:
        cal = json.load(fh)["calibration_qwen3-4b_bs4"]
    return topo, cal


@pytest.fixture(scope="module")
def alone(host):
    """The plan made in one process, per clipping (made once: each takes 1-2 s here)."""
    made: dict[float, dict] = {}

    def plan(clip: float) -> dict:
        if clip not in made:
            made[clip] = ap.plan_job(_cfg(clip), *host)
        return made[clip]

    return plan


def _cfg(clip: float = 1.0, **policy) -> JobConfig:
    return JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4,
                                "seq_len": 2048, "cpu_threads": 16, "precision": "bf16", "gpu_memory_gib": 24,
                                "optimizer": {"max_grad_norm": clip}, "policy": policy})


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_the_plan_with_the_host_cast_planned_beside_is_the_plan_planned_in_one_process(host, alone, clip, caplog):
    topo, cal = host
    cfg = _cfg(clip)
    beside = CastProcess()
    with caplog.at_level(logging.WARNING, logger=cast_process.__name__):
        planned = ap.plan_job(cfg, topo, cal, beside=beside)
    assert beside.answered, "the host cast was not planned by the other process"
    assert caplog.records == []
    assert planned == alone(clip)
    # both casts were searched and priced, one of them in the other process
    choice = planned["delivery_cast_choice"]
    assert choice["host"]["step_time_s"] and choice["gpu"]["step_time_s"]
    assert not beside.free and beside._launch is None  # used once, and ended


def test_a_process_that_died_leaves_the_plan_to_this_one_and_says_so(host, alone, caplog):
    topo, cal = host
    cfg = _cfg()
    beside = CastProcess()
    proc = beside._launch.procs[0]
    proc.kill()
    proc.wait()
    with caplog.at_level(logging.WARNING, logger=cast_process.__name__):
        planned = ap.plan_job(cfg, topo, cal, beside=beside)
    assert not beside.answered
    assert planned == alone(1.0)
    assert any("planning the host cast here" in r.getMessage() for r in caplog.records)
    assert beside._launch is None  # ended


def test_a_process_that_hangs_is_waited_for_a_bounded_time_then_the_plan_is_made_here(host, alone, monkeypatch,
                                                                                      caplog):
    """Stopped (SIGSTOP), the process never answers: the caller waits WAIT_FACTOR times its own search (here at
    least 0.5 s), then plans the host cast itself; the process is ended once it runs again (it is let run again
    when the caller ends it, however long the caller's own search took on a loaded host)."""
    topo, cal = host
    monkeypatch.setattr(cast_process, "MIN_WAIT_S", 0.5)
    monkeypatch.setattr(cast_process, "WAIT_FACTOR", 0.0)
    beside = CastProcess()
    beside._launch._connected(30)
    proc = beside._launch.procs[0]
    os.kill(proc.pid, signal.SIGSTOP)
    end = beside.close

    def resume_then_end() -> None:
        os.kill(proc.pid, signal.SIGCONT)  # so that the SIGTERM it is sent can end it
        end()

    monkeypatch.setattr(beside, "close", resume_then_end)
    with caplog.at_level(logging.WARNING, logger=cast_process.__name__):
        planned = ap.plan_job(_cfg(), topo, cal, beside=beside)
    assert not beside.answered and planned == alone(1.0)
    assert any("gave no plan" in r.getMessage() and "no result" in r.getMessage() for r in caplog.records)
    proc.wait(timeout=15)


def test_a_process_that_cannot_start_leaves_the_plan_to_this_one(host, alone, monkeypatch, caplog):
    topo, cal = host
    cfg = _cfg()

    def no_process(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(cast_process.Launch, "spawn", no_process)
    with caplog.at_level(logging.WARNING, logger=cast_process.__name__):
        beside = CastProcess()
    assert not beside.free
    assert any("did not start" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert ap.plan_job(cfg, topo, cal, beside=beside) == alone(1.0)


def test_it_is_started_only_where_a_run_plans_both_casts():
    assert early_cast_process(_cfg(), plan={"policy": {}}) is None  # a plan came with the job
    assert early_cast_process(_cfg(delivery_cast="gpu")) is None  # one cast to search
    assert early_cast_process(JobConfig.from_dict({**_cfg().to_dict(), "precision": "fp32"})) is None
    assert early_cast_process(JobConfig.from_dict({**_cfg().to_dict(), "gpus": 0, "gpu_memory_gib": None})) is None
    fixed = {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint", "edge_update": "host",
             "device_layers": 0, "resident_units": 0, "delivery_cast": "host"}
    assert early_cast_process(_cfg(**fixed)) is None  # nothing planned
    started = early_cast_process(_cfg())
    try:
        assert started is not None and started.free
    finally:
        started.close()


def test_a_run_refused_before_its_plan_ends_the_process(monkeypatch, tmp_path):
    """A job whose data file is missing is refused by the request's checks, after the planning process started:
    the process is ended, not left waiting."""
    from slidedp import launch

    made: list[CastProcess] = []

    class Recorded(CastProcess):
        def __init__(self):
            super().__init__()
            self.procs = list(self._launch.procs)
            made.append(self)

    monkeypatch.setattr(cast_process, "CastProcess", Recorded)
    cfg = JobConfig.from_dict({**_cfg().to_dict(), "data": {"path": str(tmp_path / "missing.jsonl")},
                               "output_dir": str(tmp_path / "out")})
    with pytest.raises(ConfigError, match="missing.jsonl does not exist"):
        launch.train(cfg)
    assert len(made) == 1
    assert made[0]._launch is None
    assert all(p.poll() is not None for p in made[0].procs)
