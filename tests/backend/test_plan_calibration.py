"""Which of a host's calibration records prices a plan, and why the others do not, on the nvidia-h200-x2 fixture
host: its records lack heads, kv_heads and vocab (an older runtime wrote them) and are upgraded before matching."""

from __future__ import annotations

import json
from pathlib import Path

from slidedp.config import JobConfig
from slidedp_web.planning import calibration_choice

FIXTURES = Path(__file__).resolve().parents[1] / "runtime" / "fixtures"
REPORT = {
    "dir": "/cache",
    "entries": list(json.loads((FIXTURES / "h200x2_calibration.json").read_text()).values()),
}
TOPOLOGY = json.loads((FIXTURES / "h200x2_topology.json").read_text())


def _job(**over) -> JobConfig:
    job = {
        "model": "qwen3-8b",
        "data": {"path": "x.jsonl"},
        "gpus": 2,
        "micro_batch_size": 8,
        "seq_len": 2048,
    }
    return JobConfig.from_dict({**job, "precision": "bf16", **over})


def test_the_record_measured_with_the_hosts_peer_to_peer_setting_is_used():
    for name, key in (
        ("nvlink", "fixture-qwen3-8b-bs8-nvlink"),
        ("pcie_host", "fixture-qwen3-8b-bs8-pcie-host"),
    ):
        used, match = calibration_choice(_job(), REPORT, TOPOLOGY[name])
        assert used["key"] == key and match["used"]["key"] == key
        assert match["used"]["shape_upgraded"] == ["heads", "kv_heads", "vocab"]
        assert match["why_not"] == [] and match["run"] is None


def test_a_job_no_record_fits_hears_why_for_each_and_what_to_run():
    used, match = calibration_choice(_job(gpus=1, micro_batch_size=4), REPORT, TOPOLOGY["nvlink"])
    assert used is None
    assert [w["why"] for w in match["why_not"]] == [
        ["micro-batch 8, not 4", "2 ranks, not 1"],
        ["micro-batch 8, not 4", "2 ranks, not 1", "measured with GPU peer-to-peer off, this host has it on"],
        ["2 ranks, not 1"],
    ]
    assert match["run"] == "slidedp bench --model qwen3-8b --gpus 1 --mbs 4 --seq 2048 --plan-only"
    # bench measures bf16 only: an fp32 job is calibrated by planning its own config
    _, fp32 = calibration_choice(_job(precision="fp32"), REPORT, TOPOLOGY["nvlink"])
    assert fp32["why_not"][0]["why"] == ["precision bf16, not fp32"]
    assert fp32["run"].startswith("slidedp plan --config ")
