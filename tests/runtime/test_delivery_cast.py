"""delivery_cast: gpu (the fp32 master crosses to the device and is cast there) trains the same bits as the bf16
host copy, moves 4 B/param host->device instead of 2, and keeps no bf16 copy on the host. CPU, 2 gloo ranks."""

from __future__ import annotations

import os

import pytest
import slidedp
import torch

from tests.runtime.exactness import make_model_dir, make_token_data, slidedp_tensors

STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return cast_runs(tmp_path_factory.mktemp("cast"), gpus=0)


def cast_runs(root, gpus: int, ring: bool = False) -> dict:
    """The same bf16 job with each delivery_cast (also run on 2 GPUs by tests/gpu); with ring (GPUs only) a third,
    "ring": the GPU cast through a ring of scratch buffers (policy.cast_scratch_mb), 1 MiB chunks in four buffers."""
    model = make_model_dir(str(root / "model"), "tiny-qwen3")
    data = make_token_data(str(root / "data.jsonl"), rows=2 * 2 * STEPS, seq_len=24)
    out = {}
    for cast in ("host", "gpu", "ring") if ring else ("host", "gpu"):
        d = str(root / cast)
        scratch = {"delivery_cast": "gpu", "chunk_mb": 1, "cast_scratch_mb": 2} if cast == "ring" else \
            {"delivery_cast": cast}
        result = slidedp.train({
            "model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": 24,
            "micro_batch_size": 2, "steps": STEPS, "ranks": 1 if gpus else 2, "gpus": gpus, "precision": "bf16", "output_dir": d,
            "export": False, "cpu_threads": 1, "optimizer": {"lr": 3e-3, "max_grad_norm": 0.0},
            "policy": {"delivery": "sharded", "grad_reduce": "gpu", "activations": "checkpoint",
                       "resident_units": 0, **scratch,
                       # pinned: left to AutoPolicy, a measured calibration may keep units on the device
                       "edge_update": "host", "device_layers": 0},
            "checkpoint": {"interval": STEPS, "keep": 1},
            "deterministic": bool(gpus),  # two GPU runs agree bit for bit only with deterministic kernels
        })
        assert result.status == "completed"
        out[cast] = {"result": result, "tensors": slidedp_tensors(
            os.path.join(d, "checkpoints", f"step-{STEPS:08d}"), model)}
    return out


def test_cast_on_the_device_trains_the_same_bits(runs):
    assert_same_bits(runs)


def assert_same_bits(runs: dict) -> None:
    host, gpu = runs["host"], runs["gpu"]
    for a, b in zip(host["result"].metrics, gpu["result"].metrics):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for name, t in host["tensors"][kind].items():
            assert torch.equal(t, gpu["tensors"][kind][name]), (kind, name)


def test_cast_on_the_device_moves_fp32_and_keeps_no_bf16_copy(runs):
    assert_fp32_crosses(runs)


def assert_fp32_crosses(runs: dict) -> None:
    from slidedp.presets import PRESETS, unit_param_counts

    total = sum(unit_param_counts(PRESETS["tiny-qwen3"]))
    h2d = {cast: runs[cast]["result"].metrics[-1]["bytes"]["h2d"] for cast in runs}
    assert [b * 2 for b in h2d["host"]] == h2d["gpu"]  # every delivered element is 4 bytes instead of 2
    assert sum(h2d["gpu"]) >= 4 * total  # sharded: each rank copies its shard of every unit, at least once
    assert runs["host"]["result"].policy.delivery_cast == "host"
    assert runs["gpu"]["result"].policy.delivery_cast == "gpu"


def test_the_host_cast_is_reported_as_part_of_the_update(runs):
    """phases.update_cast_busy: the seconds of update_busy spent writing the bf16 copy; none without a copy.
    phases.update_offcpu, the part of update_busy the updater lost off the CPU, is a part of it too."""
    for rec in runs["host"]["result"].metrics + runs["gpu"]["result"].metrics:
        assert 0 <= rec["phases"]["update_offcpu"] <= rec["phases"]["update_busy"], rec["phases"]
    for rec in runs["host"]["result"].metrics:
        assert 0 < rec["phases"]["update_cast_busy"] < rec["phases"]["update_busy"], rec["phases"]
    assert all(rec["phases"]["update_cast_busy"] == 0 for rec in runs["gpu"]["result"].metrics)


def test_host_state_without_the_bf16_copy_is_12_bytes_per_param():
    from slidedp.config import JobConfig
    from slidedp.launch import host_layout
    from slidedp.policy import ExecutionPolicy
    from slidedp.presets import PRESETS, unit_param_counts

    numels = unit_param_counts(PRESETS["qwen3-8b"])
    cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "precision": "bf16"})
    for cast, dtype in (("host", "bfloat16"), ("gpu", "float32")):
        policy = ExecutionPolicy.default(len(numels) - 2, delivery="sharded", grad_reduce="gpu", delivery_cast=cast)
        layout = host_layout(cfg, numels, policy)
        assert layout.delivery_dtype == dtype


def test_the_cost_model_counts_the_cast_where_it_runs():
    from slidedp.planning.cost_model import Job

    base = dict(units=[10, 20, 10], hidden=8, vocab=16, tied=False, arch="qwen3", micro_batch=1, seq=8,
                grad_accum=1, world=2, on_gpu=True, precision="bf16", clip=False, cpu_threads=4, cores=8,
                hbm_bytes=1 << 30, host_limit_bytes=1 << 30, host_limit_source="test", interconnect="nvlink")
    job = Job(**base)
    assert (job.delivered_bytes("host"), job.update_dram_bytes("host")) == (2, 34)
    assert (job.delivered_bytes("gpu"), job.update_dram_bytes("gpu")) == (4, 28)
