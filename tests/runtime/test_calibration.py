"""Calibration on this machine's CPU at tiny shapes (real torch, real transformers classes, real gloo ranks);
the CUDA paths run on the GPU machine (marker gpu)."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp.config import JobConfig  # noqa: E402
from slidedp.planning import autopolicy, calibration, model_bench, topology  # noqa: E402
from slidedp.planning import cost_model as cm  # noqa: E402
from slidedp.planning import memory_model as mm  # noqa: E402
from slidedp.planning.job import rank_threads  # noqa: E402
from slidedp.presets import model_config_dict  # noqa: E402


def _cfg(**raw):
    base = {"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "micro_batch_size": 2, "seq_len": 32}
    base.update(raw)
    return JobConfig.from_dict(base)


@pytest.fixture(scope="module")
def host():
    return topology.detect()


@pytest.fixture(scope="module")
def tiny(host):
    return calibration.calibrate(_cfg(), host, quick=True, collectives=False)


def test_calibration_measures_one_decoder_layer_at_the_job_shape(tiny):
    assert tiny["device"] == "cpu" and tiny["shape"]["micro_batch"] == 2 and tiny["shape"]["seq"] == 32
    u = tiny["unit"]
    assert u["tokens"] == 64
    assert min(u["fwd_keep_s"], u["bwd_keep_s"], u["fwd_checkpoint_s"], u["bwd_checkpoint_s"]) > 0
    assert u["saved_checkpoint_bytes"] == 2 * 32 * 64 * 2  # the bf16 layer input
    assert u["saved_keep_bytes"] > 5 * u["saved_checkpoint_bytes"]
    assert tiny["loss_head"]["s_per_token"] >= 0 and tiny["embedding"]["fwd_s"] > 0
    assert json.loads(json.dumps(tiny)) == tiny


def test_measured_saved_bytes_agree_with_the_structural_estimate(tiny, host):
    job = cm.Job.from_config(_cfg(), host)
    assert tiny["unit"]["saved_keep_bytes"] == pytest.approx(mm.estimate_saved_bytes(job), rel=0.1)
    llama = _cfg(model="tiny-llama")
    parts = model_bench.ModelParts(model_config_dict("tiny-llama"), torch.device("cpu"), torch.bfloat16)
    measured = parts.decoder_layer(2, 32, reps=1)["saved_keep_bytes"]
    assert measured == pytest.approx(mm.estimate_saved_bytes(cm.Job.from_config(llama, host)), rel=0.1)


def test_host_rates_are_measured_for_the_threads_the_job_uses(tiny, host):
    cpu = tiny["cpu"]
    per_rank = max(1, host["cpu"]["cores"] - 1)  # a one-rank CPU job leaves a core to the rest of the host
    assert per_rank in cpu["threads"] and rank_threads(_cfg(), host["cpu"]["cores"]) == per_rank
    assert len(cpu["update_s_per_1e9"]) == len(cpu["threads"]) == len(cpu["copy_GBps"])
    assert all(v > 0 for v in cpu["adamw_s_per_1e9"] + cpu["update_s_per_1e9"] + cpu["copy_GBps"])


def test_a_cpu_job_leaves_a_core_to_the_host_and_a_gpu_job_splits_them_all():
    assert [rank_threads(_cfg(gpus=0, ranks=r), 16) for r in (1, 2, 3)] == [15, 7, 5]
    assert [rank_threads(_cfg(gpus=0, ranks=r), 2) for r in (1, 2)] == [1, 1]
    assert rank_threads(_cfg(gpus=0, ranks=1), 1) == 1
    assert [rank_threads(_cfg(gpus=g), 16) for g in (1, 2)] == [16, 8]
    assert rank_threads(_cfg(gpus=0, cpu_threads=2), 2) == 2  # the config's figure is kept as it is


def test_a_cpu_job_is_planned_with_its_own_calibration(tiny, host):
    plan = autopolicy.plan_job(_cfg(), host, tiny)
    assert plan["feasible"] and plan["calibration"] == "measured"
    assert plan["predicted"]["step_time_s"] > 0 and plan["predicted"]["hbm_peak_gib"] is None
    assert plan["why"].startswith("CPU training with 1 rank")


def test_calibration_is_cached_per_host_and_shape(tmp_path, monkeypatch, host, tiny):
    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path))
    cfg = _cfg()
    path = calibration.cache_path(cfg, host)
    assert path.startswith(str(tmp_path)) and os.path.basename(path).startswith(host["hostname"] + "-")
    calibration.save_calibration(tiny, path)
    assert calibration.load_or_calibrate(cfg, host, quick=True) == tiny  # no new measurement
    assert calibration.calibration_key(_cfg(micro_batch_size=4), host) != calibration.calibration_key(
        cfg, host
    )
    # a quick calibration does not stand in for a full one: this measures again and replaces the file
    full = calibration.load_or_calibrate(cfg, host, quick=False)
    assert full["quick"] is False and os.listdir(tmp_path) == [os.path.basename(path)]
    with open(path) as fh:
        assert json.load(fh)["created_at"] == full["created_at"]


def test_collectives_are_timed_inside_real_gloo_ranks():
    sizes = [64 * 1024, 256 * 1024]
    got = calibration.measure_collectives(2, "gloo", sizes)
    assert got["backend"] == "gloo" and got["world"] == 2
    for op in ("all_gather", "reduce_scatter"):
        assert [r["bytes"] for r in got[op]] == sizes and all(r["s"] > 0 for r in got[op])
    merged = calibration.merge_collectives({"schema": 1}, got)
    assert merged["collectives"] is got

def test_the_update_is_timed_beside_the_issuing_threads_load(host):
    """update_in_step runs the engine's update in a thread of its own, unit-sized chunk by chunk, alone and while
    the calling thread runs the load until the timing ends (a failing update ends the load too)."""
    from slidedp.planning import microbench

    cfg = _cfg(cpu_threads=1)
    parts = model_bench.ModelParts(model_config_dict("tiny-qwen3"), torch.device("cpu"), torch.bfloat16)
    loops = []

    def load(stop):
        loops.append(0)
        parts.issue_loop(2, 32)(stop)

    got = microbench.update_in_step(cfg, host, 1 << 18, load, "tiny layer", params=1 << 20)
    assert got["chunk"] == 1 << 18 and got["threads"] == 1 and got["cast"]
    assert got["alone_s_per_1e9"] > 0 and got["beside_load_s_per_1e9"] > 0 and loops == [0]
    assert 0 <= got["offcpu_alone"] < 1 and 0 <= got["offcpu_beside_load"] < 1

    def broken(*_args, **_kw):
        raise ValueError("update failed")

    orig, microbench.update_shard_ = microbench.update_shard_, broken
    try:
        with pytest.raises(ValueError):
            microbench.update_in_step(cfg, host, 1 << 18, lambda stop: stop.wait(30), "idle", params=1 << 20)
    finally:
        microbench.update_shard_ = orig


def test_host_figures_are_timed_over_a_window_not_three_runs(host):
    """Host memory's capacity timed over three updates (a tenth of a second) spread 7% over four runs on one host,
    over one second 1%; each host figure is now the median of as many runs as fill a window (at least three)."""
    import time

    from slidedp.planning import microbench

    calls = []
    assert microbench.median_time(lambda: calls.append(time.perf_counter()), 3, False) >= 0
    assert len(calls) == 4  # a warm-up, then three
    calls.clear()

    def slow():
        calls.append(time.perf_counter())
        time.sleep(0.01)

    assert 0.009 < microbench.median_time(slow, 3, False, window_s=0.2) < 0.2
    assert calls[-1] - calls[1] >= 0.18 and len(calls) >= 10  # the window filled, after the warm-up
    assert microbench.HOST_WINDOW_S >= 1.0

    cfg = _cfg(cpu_threads=1)
    timed = []
    orig = microbench.update_shard_

    def counted(*args, **kw):
        timed.append(time.perf_counter())
        return orig(*args, **kw)

    microbench.update_shard_ = counted
    try:
        got = microbench.update_in_step(cfg, host, 1 << 18, lambda stop: stop.wait(30), "idle", params=1 << 20,
                                        window_s=0.3)
    finally:
        microbench.update_shard_ = orig
    assert got["window_s"] == 0.3
    # two timings (alone, beside the load), each a warm-up pass and passes filling 0.3 s, 4 chunks a pass
    assert timed[-1] - timed[0] >= 0.6 and len(timed) >= 2 * 4 * 4


@pytest.mark.gpu
def test_gpu_calibration_sees_pcie_and_the_loss_head_peak(host):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = _cfg(model="qwen3-0.6b", gpus=min(2, torch.cuda.device_count()), micro_batch_size=1, seq_len=512)
    got = calibration.calibrate(cfg, host, quick=False)
    ins = got["update_in_step"]
    assert ins["alone_s_per_1e9"] > 0 and ins["beside_load_s_per_1e9"] > 0
    t = got["transfers"]
    assert min(t["h2d_GBps"]) > 1 and min(t["d2h_GBps"]) > 1 and t["bidir_GBps"] > max(t["h2d_GBps"])
    assert got["loss_head"]["peak_bytes_per_token"] > 0
    if cfg.gpus > 1:
        assert got["collectives"]["backend"] == "nccl" and got["collectives"]["world"] == cfg.gpus
    plan = autopolicy.plan_job(cfg, host, got)
    assert plan["feasible"] and plan["predicted"]["step_time_s"] > 0


# ---------------------------------------------------------------------------- CPU jobs calibrate themselves
DEMO_JOB = os.path.join(os.path.dirname(calibration.__file__), "..", "assets", "demo", "job.yaml")

_TWO_CORE_CALIBRATION = """
import json, os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
from slidedp.config import JobConfig, load_config_file
from slidedp.planning import calibration, topology
cfg = JobConfig.from_dict(load_config_file(sys.argv[1]))
host = topology.detect(cfg.host_ram_gib)
first = calibration.load_or_calibrate(cfg, host, on_log=lambda line: print(line, file=sys.stderr))
def measured_again(*_a, **_k):
    raise AssertionError("measured again: the cached calibration was not used")
calibration.calibrate = measured_again
second = calibration.load_or_calibrate(cfg, host)
print(json.dumps({"cores": host["cpu"]["cores"], "same": first == second, "first": first,
                  "files": os.listdir(calibration.cache_dir())}))
"""


@pytest.mark.slow  # a fresh interpreter loads torch and transformers' model classes before it measures
@pytest.mark.timeout(300)
def test_the_cpu_demo_calibrates_on_two_cores_and_is_cached(tmp_path):
    """The CPU demo's calibration on two cores (the process pinned to two of this machine's): it measures what
    a CPU job needs (its own thread count, no transfers, no device update), and the second call reads the cache."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    import subprocess
    import sys

    env = {**os.environ, "SLIDEDP_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _TWO_CORE_CALIBRATION, DEMO_JOB], env=env, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cores"] == 2 and got["same"] is True and "calibrating this host for demo-qwen3" in done.stderr
    cal = got["first"]
    assert cal["device"] == "cpu" and cal["quick"] is False and cal["shape"]["model"] == "demo-qwen3"
    assert cal["cpu"]["threads"] == [1]  # the demo's one rank on one core, the other left to the host
    assert not {"transfers", "device_update", "host_dram", "update_in_step"} & set(cal)
    assert cal["unit"]["fwd_keep_s"] > 0 and cal["unit"]["bwd_keep_s"] > 0 and cal["elapsed_s"] > 0
    assert got["files"] == [f"{cal['host']}-{cal['key']}.json"]


def test_a_cpu_job_is_calibrated_at_its_own_thread_count(host):
    """The cache key of a CPU job carries its rank's thread count (its parts are timed at it); a GPU job's key
    does not depend on it."""
    one, two = _cfg(cpu_threads=1), _cfg(cpu_threads=2)
    assert calibration.calibration_key(one, host) != calibration.calibration_key(two, host)
    gpu_host = {**host, "gpus": [{"index": 0, "name": "NVIDIA H200", "hbm_bytes": 140 * 2**30}]}
    assert calibration.calibration_key(_cfg(gpus=1, cpu_threads=1), gpu_host) == calibration.calibration_key(
        _cfg(gpus=1, cpu_threads=2), gpu_host)
    from slidedp.planning import microbench

    assert microbench.thread_counts(_cfg(ranks=2, cpu_threads=1), {"cpu": {"cores": 16}}, cuda=False) == [1, 2]
    assert microbench.thread_counts(_cfg(gpus=1), {"cpu": {"cores": 16}}) == [4, 8, 16]


def _tokens(path) -> str:
    rows = [{"input_ids": [3 + (7 * r + i) % 500 for i in range(32)]} for r in range(8)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_train_on_the_cpu_calibrates_and_records_a_prediction(tmp_path, monkeypatch):
    """train() of a CPU job calibrates this host for its shape (cached) and every metrics record carries the
    predicted step time beside the measured one."""
    import slidedp

    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "calibration"))
    cfg = _cfg(data={"path": _tokens(tmp_path / "tokens.jsonl"), "format": "tokens"}, steps=2, export=False,
               cpu_threads=1, precision="fp32", output_dir=str(tmp_path / "run"))
    records, lines = [], []
    result = slidedp.train(cfg, on_step=records.append, on_log=lines.append)
    assert result.status == "completed" and result.plan["calibration"] == "measured"
    assert any(line.startswith("calibrating this host for tiny-qwen3") for line in lines), lines
    assert len(records) == 2
    for rec in records:
        assert rec["predicted"]["step_time_s"] > 0 and rec["step_time_s"] > 0
    # the one record of this shape (beside it, the ranks' bytecode cache where this tree has no bytecode)
    records = [n for n in os.listdir(tmp_path / "calibration") if n.endswith(".json")]
    assert records == [os.path.basename(calibration.cache_path(cfg, topology.detect()))]
    assert set(os.listdir(tmp_path / "calibration")) <= {*records, "bytecode"}


def test_slidedp_plan_prints_a_cpu_jobs_predicted_step_time(tmp_path, monkeypatch, capsys):
    from slidedp import cli

    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": "tiny-qwen3", "data": {"path": "x.jsonl"}, "gpus": 0, "ranks": 1,
                               "micro_batch_size": 2, "seq_len": 32, "cpu_threads": 1}))
    assert cli.main(["plan", "--config", str(job)]) == 0
    out = capsys.readouterr()
    assert "calibrating this host for tiny-qwen3" in out.err
    step = [line for line in out.out.splitlines() if line.startswith("predicted:")]
    assert step and step[0].split()[1].replace(".", "", 1).isdigit() and float(step[0].split()[1]) > 0, out.out
    assert cli.main(["plan", "--config", str(job), "--no-calibration"]) == 0
    assert "predicted: no step time" in capsys.readouterr().out


def test_a_saved_config_with_per_layer_types_builds_its_one_layer_parts():
    """A config saved by transformers 5 lists `layer_types` per layer (Qwen3, Llama...); the calibration's one-layer
    copy must shorten that list with num_hidden_layers, or transformers refuses the config and a job loaded from
    a Hugging Face directory is planned without a calibration."""
    mc = dict(model_config_dict("tiny-qwen3"))
    mc["layer_types"] = ["full_attention"] * mc["num_hidden_layers"]
    parts = model_bench.ModelParts(mc, torch.device("cpu"), torch.bfloat16)
    assert parts.config.num_hidden_layers == 1 and list(parts.config.layer_types) == ["full_attention"]
