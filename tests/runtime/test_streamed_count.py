"""AutoPolicy's count of streamed layers (slidedp.planning.streamed): the shares of the free layers are only where
the search starts; the count then moves a layer at a time while the step shortens, so the chosen count is no slower
than either neighbour. The case: Qwen3-4B at micro-batch 4 x 2048 under a 24 GiB cap on the one-H200 machine,
clipping at 1.0 (calibration measured there, docs/results/s21): the shares price 9, 18 and 27 streamed layers,
and 17 plans faster than 18."""

import json
import os

from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
CALIBRATION = os.path.join(ROOT, "docs", "results", "s21", "calibration", "vm-bf51d61850786b46.json")


def plan(policy: dict) -> dict:
    with open(os.path.join(HERE, "fixtures", "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    with open(CALIBRATION) as fh:
        cal = json.load(fh)
    cfg = JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4,
                               "seq_len": 2048, "cpu_threads": 16, "precision": "bf16", "gpu_memory_gib": 24,
                               "optimizer": {"max_grad_norm": 1.0}, "policy": policy})
    out = ap.plan_job(cfg, topo, cal)
    assert out["feasible"], out.get("errors")
    return out


def test_the_streamed_count_is_no_slower_than_either_neighbour():
    free = plan({})
    pol = free["policy"]
    n, step = pol["streamed_layers"], free["predicted"]["step_time_s"]
    assert 0 < n < 36 - pol["device_layers"]
    for m in (n - 1, n + 1):
        other = plan({"streamed_layers": m, "device_layers": pol["device_layers"]})
        assert step <= other["predicted"]["step_time_s"] * (1 + 1e-9), (n, m, step, other["predicted"])
