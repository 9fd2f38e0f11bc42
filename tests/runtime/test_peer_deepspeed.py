"""The DeepSpeed ZeRO-Offload peer: its config, its launch settings, the bench's peer specs, and — where DeepSpeed
is at hand (.peer-pkgs from `scripts/build_peer_wheels.sh --local`, or installed) — DeepSpeed's own validation
of the config and a two-rank run on DeepSpeed's CPU accelerator. DeepSpeed is no dependency of slidedp: without
it only the first part runs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slidedp import bench
from slidedp.peers import deepspeed_zero, fsdp2
from slidedp.presets import TINY_VOCAB

PEER_PKGS = Path(__file__).resolve().parents[2] / ".peer-pkgs"
SHAPE = {"model": "tiny-qwen3", "gpus": 0, "ranks": 2, "mbs": 2, "seq": 32, "steps": 4, "warmup": 1}


def _deepspeed_path() -> str | None:
    """A folder to put on the path for deepspeed, "" when it imports as things are, None when it is absent."""
    if (PEER_PKGS / "deepspeed").is_dir():
        return str(PEER_PKGS)
    return "" if importlib.util.find_spec("deepspeed") is not None else None


needs_deepspeed = pytest.mark.skipif(
    _deepspeed_path() is None, reason="deepspeed absent: scripts/build_peer_wheels.sh --local makes .peer-pkgs")


@pytest.fixture
def captured_launch(monkeypatch):
    """run_ranks replaced by a recorder: what the peer would launch, and no process started."""
    calls: list[dict] = []

    def record(module, row, world, timeout_s, *, data_rows=None, env=None):
        calls.append({"module": module, "row": row, "world": world, "env": env, "data_rows": data_rows})
        return dict(row, step_s=1.0)

    monkeypatch.setattr(deepspeed_zero, "run_ranks", record)
    return calls


# ---------------------------------------------------------------------------------------------- without deepspeed
def test_missing_deepspeed_is_an_error_row_and_starts_no_rank(monkeypatch, captured_launch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "deepspeed" else find_spec(name, *a))
    row = deepspeed_zero.run_deepspeed("tiny-qwen3", 2, 4, 64, 3, 1, stage=2, threads=8)
    assert row["error"] == ("deepspeed is not installed: run scripts/build_peer_wheels.sh and install "
                            ".device-wheels (see the script)")
    assert row["peer"] == "ds-zero2" and "step_s" not in row
    assert captured_launch == []


def test_zero2_offloads_the_optimizer_to_pinned_host_memory():
    cfg = deepspeed_zero.zero_config(2, mbs=4, lr=1e-5, max_grad_norm=1.0, threads=16)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 2
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in zero and not any(k.startswith("stage3_") for k in zero)
    assert zero["overlap_comm"] is True and zero["contiguous_gradients"] is True
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["gradient_clipping"] == 1.0


def test_zero3_offloads_parameters_and_optimizer():
    cfg = deepspeed_zero.zero_config(3, mbs=8, lr=2e-5, max_grad_norm=0.0, threads=16)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["stage3_prefetch_bucket_size"] == 500_000_000
    assert zero["stage3_param_persistence_threshold"] == 1_000_000
    assert cfg["train_micro_batch_size_per_gpu"] == 8 and cfg["gradient_clipping"] == 0.0  # 0: no clipping


def test_optimizer_is_deepspeeds_cpu_adamw_with_slidedps_defaults():
    opt = deepspeed_zero.zero_config(2, mbs=1, lr=3e-5, max_grad_norm=0.0, threads=1)["optimizer"]
    assert opt["type"] == "AdamW"
    assert opt["params"] == {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0,
                             "torch_adam": False, "adam_w_mode": True}


def test_config_refuses_what_the_peer_does_not_run():
    for stage in (0, 1, 4):
        with pytest.raises(ValueError, match="stage"):
            deepspeed_zero.zero_config(stage, 4, 1e-5, 0.0, 8)
    with pytest.raises(ValueError):
        deepspeed_zero.zero_config(2, 4, 1e-5, 0.0, threads=0)
    with pytest.raises(ValueError):
        deepspeed_zero.zero_config(2, 4, 1e-5, -1.0, 8)


def test_ranks_get_explicit_threads_the_accelerator_and_the_config(monkeypatch, captured_launch):
    monkeypatch.setattr(deepspeed_zero, "deepspeed_site", lambda: "/nowhere")
    rows = [[1] * 64] * 3
    row = deepspeed_zero.run_deepspeed("qwen3-8b", 2, 4, 64, 5, 2, stage=3, threads=None, lr=2e-5,
                                       max_grad_norm=1.0, data_rows=rows)
    (call,) = captured_launch
    assert call["module"] == "slidedp.peers.deepspeed_zero" and call["world"] == 2 and call["data_rows"] == rows
    threads = max(1, fsdp2.cores() // 2)  # none given: the cores this process may use, split over the ranks
    assert call["env"]["OMP_NUM_THREADS"] == str(threads) and row["threads"] == threads
    assert call["env"]["DS_ACCELERATOR"] == "cuda"
    assert row["ds_config"] == deepspeed_zero.zero_config(3, 4, 2e-5, 1.0, threads)
    assert row["peer"] == "ds-zero3" and row["optimizer"] == "DeepSpeedCPUAdam" and row["keep_layers"] == 0

    captured_launch.clear()
    deepspeed_zero.run_deepspeed("tiny-qwen3", 0, 2, 32, 2, 0, stage=2, threads=3, ranks=2)
    assert captured_launch[0]["env"]["DS_ACCELERATOR"] == "cpu" and captured_launch[0]["world"] == 2
    assert captured_launch[0]["env"]["OMP_NUM_THREADS"] == "3"


def test_ranks_find_the_ninja_installed_next_to_deepspeed(monkeypatch, tmp_path, captured_launch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ninja").write_text("")
    monkeypatch.setattr(deepspeed_zero, "deepspeed_site", lambda: str(tmp_path))
    monkeypatch.setattr(deepspeed_zero.shutil, "which", lambda name: None)
    deepspeed_zero.run_deepspeed("tiny-qwen3", 1, 1, 8, 1, 0, stage=2, threads=1)
    assert captured_launch[0]["env"]["PATH"].split(os.pathsep)[0] == str(tmp_path / "bin")

    captured_launch.clear()
    monkeypatch.setattr(deepspeed_zero.shutil, "which", lambda name: "/usr/bin/ninja")
    deepspeed_zero.run_deepspeed("tiny-qwen3", 1, 1, 8, 1, 0, stage=2, threads=1)
    assert "PATH" not in captured_launch[0]["env"]  # one on PATH already is used as it is


def test_bad_arguments_are_refused_before_any_process_starts(captured_launch):
    with pytest.raises(ValueError):
        deepspeed_zero.run_deepspeed("tiny-qwen3", 0, 2, 32, 4, 1, stage=2, threads=1, ranks=0)
    with pytest.raises(ValueError):
        deepspeed_zero.run_deepspeed("tiny-qwen3", 1, 2, 32, 4, 1, stage=1, threads=1)
    with pytest.raises(ValueError):
        deepspeed_zero.run_deepspeed("tiny-qwen3", 1, 2, 32, 4, 1, stage=2, threads=1, data_rows=[[1, 2]])
    assert captured_launch == []


# ---------------------------------------------------------------------------------------------- bench specs
@pytest.fixture
def peer_calls(monkeypatch):
    calls: list[tuple[str, tuple, dict]] = []

    def fake(name):
        def run(*args, **kwargs):
            calls.append((name, args, kwargs))
            return {"peer": name, "step_s": 1.0}

        return run

    monkeypatch.setattr(deepspeed_zero, "run_deepspeed", fake("deepspeed"))
    monkeypatch.setattr(fsdp2, "run_fsdp2", fake("fsdp2"))
    return calls


def test_bench_routes_ds_specs_to_the_deepspeed_peer(peer_calls):
    rows = [[0] * 16]
    row = bench.run_peer("ds-zero2", "qwen3-8b", 2, 4, 16, 6, 2, 12, 1e-5, rows)
    assert row["policy"] == "ds-zero2" and row["peer"] == "deepspeed"
    name, args, kwargs = peer_calls[-1]
    assert args == ("qwen3-8b", 2, 4, 16, 6, 2)
    assert kwargs == {"stage": 2, "threads": 12, "lr": 1e-5, "max_grad_norm": 0.0, "data_rows": rows, "ranks": 0,
                      "gpu_memory_gib": None}

    bench.run_peer("ds-zero3:0.5", "tiny-qwen3", 0, 2, 16, 4, 1, None, 1e-3, rows)
    name, args, kwargs = peer_calls[-1]
    assert name == "deepspeed" and kwargs["stage"] == 3 and kwargs["max_grad_norm"] == 0.5
    assert kwargs["ranks"] == 2 and kwargs["threads"] is None  # the CPU form: two gloo ranks


def test_bench_still_routes_fsdp2_specs(peer_calls):
    bench.run_peer("fsdp2-offload:none:1.0", "qwen3-8b", 2, 4, 16, 6, 2, 8, 1e-5, [[0] * 16])
    name, _, kwargs = peer_calls[-1]
    assert name == "fsdp2" and kwargs["offload"] is True and kwargs["keep_layers"] is None
    assert kwargs["max_grad_norm"] == 1.0


@pytest.mark.parametrize("spec", ["deepspeed", "ds-zero1", "ds-zero3-offload", "ds-zero2:1.0:4", "fsdp2:0:1:eager:2"])
def test_bench_refuses_unknown_peer_specs_naming_the_accepted_forms(peer_calls, spec):
    with pytest.raises(ValueError) as err:
        bench.run_peer(spec, "qwen3-8b", 2, 4, 16, 6, 2, 8, 1e-5, [[0] * 16])
    for form in ("fsdp2[:keep[:clip[:layers]]]", "fsdp2-offload[:keep[:clip[:layers]]]", "ds-zero2[:clip]",
                 "ds-zero3[:clip]"):
        assert form in str(err.value)
    assert peer_calls == []


# ---------------------------------------------------------------------------------------------- with deepspeed
VALIDATE = """
import json, sys
from deepspeed.runtime.config import DeepSpeedConfig
def name(v):  # an enum member, or its value where the model keeps values
    return None if v is None else str(getattr(v, "value", v))

out = []
for cfg in json.loads(sys.argv[1]):
    c = DeepSpeedConfig(cfg)
    z = c.zero_config
    out.append({"stage": int(z.stage), "opt_device": name(z.offload_optimizer.device),
                "opt_pin": z.offload_optimizer.pin_memory,
                "param_device": z.offload_param and name(z.offload_param.device),
                "prefetch": z.prefetch_bucket_size, "persistence": z.param_persistence_threshold,
                "bf16": c.bfloat16_config.enabled, "clip": c.gradient_clipping, "mbs": c.train_micro_batch_size_per_gpu,
                "optimizer": c.optimizer_name, "lr": c.optimizer_params["lr"], "betas": c.optimizer_params["betas"]})
try:
    DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "ofload_param": {}}})
    out.append("accepted a misspelt key")
except Exception as exc:
    out.append(type(exc).__name__)
print(json.dumps(out))
"""


@needs_deepspeed
def test_deepspeed_itself_accepts_the_config_as_meant():
    cfgs = [deepspeed_zero.zero_config(s, 4, 2e-5, 1.0, 8) for s in (2, 3)]
    env = dict(os.environ)
    path = _deepspeed_path()
    if path:
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", VALIDATE, json.dumps(cfgs)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    z2, z3, misspelt = json.loads(proc.stdout.strip().splitlines()[-1])
    assert misspelt == "ValidationError"  # DeepSpeed's pydantic models forbid unknown keys: the check has teeth
    common = {"opt_device": "cpu", "opt_pin": True, "bf16": True, "clip": 1.0, "mbs": 4, "optimizer": "adamw",
              "lr": 2e-5, "betas": [0.9, 0.95]}
    assert z2 == dict(common, stage=2, param_device=None, prefetch=z2["prefetch"], persistence=z2["persistence"])
    assert z3 == dict(common, stage=3, param_device="cpu", prefetch=500_000_000, persistence=1_000_000)


@pytest.fixture(scope="module")
def cpu_runs():
    """Both stages on DeepSpeed's CPU accelerator, two gloo ranks, the very same rows, clipping at norm 1."""
    path = _deepspeed_path()
    rows = fsdp2.random_rows(SHAPE["steps"] * SHAPE["ranks"] * SHAPE["mbs"], SHAPE["seq"], TINY_VOCAB).tolist()
    with pytest.MonkeyPatch.context() as mp:
        if path:
            mp.syspath_prepend(path)
            mp.setenv("PYTHONPATH", path + (os.pathsep + os.environ["PYTHONPATH"]
                                             if os.environ.get("PYTHONPATH") else ""))
        # the first run compiles DeepSpeed's CPU ops (minutes on two cores), later ones find them cached
        return {stage: deepspeed_zero.run_deepspeed(**SHAPE, stage=stage, threads=1, lr=1e-2, max_grad_norm=1.0,
                                                    data_rows=rows, timeout_s=1500)
                for stage in (2, 3)}


@pytest.mark.slow
@pytest.mark.timeout(3200)
@needs_deepspeed
def test_cpu_runs_of_both_stages_train_the_same_numbers_with_deepspeeds_cpu_adam(cpu_runs):
    for stage, row in cpu_runs.items():
        assert "error" not in row, row.get("error")
        assert row["peer"] == f"ds-zero{stage}" and row["world"] == 2 and row["threads"] == 1
        assert row["optimizer"] == "DeepSpeedCPUAdam"  # reported by the rank: the class DeepSpeed built
        assert row["grad_comm_dtype"] == "bfloat16" and row["deepspeed"] and row["setup_s"] > 0
        assert row["step_s"] == sorted(row["times"][1:])[1]
        assert row["tokens_per_s"] == pytest.approx(2 * 32 * 2 / row["step_s"])
        assert row["params"] == 238_272 and row["hbm_peak_gib"] == 0.0 and row["host_rss_gib"] > 0.1
        assert len(row["losses"]) == 4 and all(math.isfinite(x) for x in row["losses"])
        assert row["losses"][0] == pytest.approx(math.log(TINY_VOCAB), rel=0.1)
        assert len(row["grad_norms"]) == 4 and all(0 < g < 1e3 for g in row["grad_norms"])
    # Same weights (rank 0's, broadcast), same rows, same CPU Adam: where the bf16 parameters live changes nothing
    assert cpu_runs[3]["losses"] == pytest.approx(cpu_runs[2]["losses"], rel=1e-5)
    assert cpu_runs[3]["grad_norms"] == pytest.approx(cpu_runs[2]["grad_norms"], rel=1e-4)


@pytest.mark.gpu
@needs_deepspeed
@pytest.mark.timeout(1800)
def test_gpu_zero_offload_runs_with_deepspeeds_cpu_adam():
    import torch

    gpus = min(2, torch.cuda.device_count())
    for stage in (2, 3):
        row = deepspeed_zero.run_deepspeed("tiny-qwen3", gpus, 2, 64, 4, 1, stage=stage, threads=4, lr=1e-3,
                                           max_grad_norm=1.0, timeout_s=1500)
        assert "error" not in row, row.get("error")
        assert row["optimizer"] == "DeepSpeedCPUAdam" and row["hbm_peak_gib"] > 0 and row["step_s"] > 0
        assert row["losses"][0] == pytest.approx(math.log(TINY_VOCAB), rel=0.1)
