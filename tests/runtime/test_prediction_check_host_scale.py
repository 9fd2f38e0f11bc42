"""scripts/prediction_check.py --host-scale K: the rows priced as if the host's memory work took K times its
calibrated time, and the cost model as it was once the question is answered."""

from __future__ import annotations

import json
import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning.cost_model import Rates
from slidedp.planning.job import Job

from scripts import prediction_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rates() -> Rates:
    """The s17 calibration of Qwen3-4B at micro-batch 4 (a measured one-GPU record) and its job."""
    with open(os.path.join(ROOT, "docs", "results", "s17", "calibration", "vm-3f733d50e10c1aa8.json")) as fh:
        cal = json.load(fh)
    with open(os.path.join(ROOT, "tests", "runtime", "fixtures", "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    s = cal["shape"]
    cfg = JobConfig.from_dict({"model": s["model"], "data": {"path": "x.jsonl"}, "gpus": 1, "seq_len": s["seq"],
                               "micro_batch_size": s["micro_batch"], "cpu_threads": 16, "precision": "bf16"})
    return Rates(cal, Job.from_config(cfg, topo))


def test_the_host_terms_are_scaled_inside_and_restored_after():
    rates = _rates()
    before = (rates.update_s(10_000_000, "host"), rates.copy_s(4e9), rates.pools())
    assert all(before[:2]) and before[2][0] and before[2][1]
    with prediction_check.host_scaled(1.25):
        assert rates.update_s(10_000_000, "host") == pytest.approx(before[0] * 1.25)
        assert rates.copy_s(4e9) == pytest.approx(before[1] * 1.25)
        dram, link = rates.pools()
        assert dram == pytest.approx(before[2][0] / 1.25) and link == before[2][1]  # the GPU link is not the host
    assert (rates.update_s(10_000_000, "host"), rates.copy_s(4e9), rates.pools()) == before


def test_observed_rows_are_planned_with_the_factors_earlier_rows_of_their_calibration_left():
    """--observed: a row's own factor (measured over planned updater busy time) is kept for the next row of its
    calibration and clipping, which is planned with it."""
    with open(prediction_check.H100_TOPOLOGY) as fh:
        topology = json.load(fh)
    rows = [r for r in prediction_check.measured_rows("h100") if r["source"].startswith("s33/r1/") and r.get("clipped")]
    assert len(rows) >= 2
    observed: dict = {}
    first = prediction_check.repredict(rows[0], topology, observed)
    assert first["host_factor"] == 1.0
    (key, factors), = observed.items()
    measured, planned = first["phases"]["update_busy"]
    assert key == (first["calibration"], True) and factors == [pytest.approx(measured / planned)]
    second = prediction_check.repredict(rows[1], topology, observed)
    assert second["calibration"] == first["calibration"] and second["host_factor"] == pytest.approx(factors[0])
    assert len(observed[key]) == 2


def test_host_scaled_update_only_scales_the_host_update_alone_and_restores_it():
    rates = _rates()
    before = (rates.update_s(10_000_000, "host"), rates.copy_s(4e9), rates.pools())
    with prediction_check.host_scaled(1.3, update_only=True):
        assert rates.update_s(10_000_000, "host") == pytest.approx(before[0] * 1.3)
        assert (rates.copy_s(4e9), rates.pools()) == before[1:]
    assert (rates.update_s(10_000_000, "host"), rates.copy_s(4e9), rates.pools()) == before
