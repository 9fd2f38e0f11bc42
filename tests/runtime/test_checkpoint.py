"""Checkpoints: a run stopped with a save and resumed equals the uninterrupted run bit for bit; writes are atomic.

Contract (issue 4): on the CPU with 2 real gloo ranks, run A trains 6 steps in one go; run B is stopped with
`should_stop() == "save"` part-way and resumed with `resume: true`. B's final master weights and both AdamW
moments are bitwise equal to A's, every step's loss and gradient norm are equal, and B's metrics.jsonl holds
steps 1..6 once each. The data is shuffled and crosses epochs, the learning rate follows a cosine schedule and
clipping fires, so the data position, the step count and the schedule all have to be restored. Two variants:
fp32 with the sharded / gpu routes, and (slow) bf16 with the replicated / host routes, whose bf16 delivery copy
is rebuilt from the master at resume.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import slidedp  # noqa: E402
from slidedp.config import ConfigError, JobConfig  # noqa: E402
from slidedp.persist import checkpoint as ckpt  # noqa: E402

from tests.runtime.exactness import make_token_data, read_metrics, slidedp_tensors  # noqa: E402

STEPS, SEQ, MBS, RANKS = 6, 32, 2, 2
ROWS = 10  # 4 rows per step: epochs end inside steps 3 and 5


def _config(data: str, out: str, **over) -> dict:
    cfg = {
        "model": "tiny-qwen3",
        "data": {"path": data, "format": "tokens", "shuffle": True, "seed": 7},
        "seq_len": SEQ, "micro_batch_size": MBS, "steps": STEPS, "ranks": RANKS, "precision": "fp32",
        "output_dir": out, "export": False, "cpu_threads": 1,
        "optimizer": {"lr": 3e-3, "weight_decay": 0.1, "eps": 1e-6, "max_grad_norm": 1.0},
        "schedule": {"warmup_steps": 1, "decay": "cosine", "min_lr_ratio": 0.1},
        # explicit policy: nothing for the planner to choose
        "policy": {"delivery": "sharded", "grad_reduce": "gpu", "activations": "checkpoint", "resident_units": 0},
        "checkpoint": {"interval": 2, "keep": 2},
    }
    cfg.update(over)
    return cfg


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


VARIANTS = [
    pytest.param({}, id="fp32-sharded-gpu"),
    # bf16: the delivery copy is rebuilt from the master at resume; host route: the host sums the gradients
    pytest.param({"precision": "bf16", "policy": {"delivery": "replicated", "grad_reduce": "host",
                                                  "activations": "checkpoint", "resident_units": 0}},
                 id="bf16-replicated-host", marks=pytest.mark.slow),
    # the embedding, head and first layer live on the devices between checkpoints: written back before each,
    # loaded at resume
    pytest.param({"precision": "bf16", "policy": {"delivery": "sharded", "grad_reduce": "gpu", "edge_update": "gpu",
                                                  "device_layers": 1, "activations": "checkpoint",
                                                  "resident_units": 0}},
                 id="bf16-edge-on-device", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=VARIANTS)
def runs(request, tmp_path_factory):
    return stop_and_resume(tmp_path_factory.mktemp("resume"), request.param)


def stop_and_resume(root, variant: dict) -> dict:
    """Run A in one go; run B stopped with a save part-way, then resumed (also by the GPU resume test)."""
    data = make_token_data(str(root / "data.jsonl"), rows=ROWS, seq_len=SEQ, seed=3)
    a_out, b_out = str(root / "A"), str(root / "B")
    a = slidedp.train(_config(data, a_out, **variant))

    # B stops with a save as soon as step 2 is reported: the ranks are then in step 3 or 4, and the launcher writes
    # the checkpoint of the last step they finish. (With no interval checkpoints in this leg, the stop's own
    # checkpoint is the only one; the interval does not touch the numerics, and the resumed leg uses A's.)
    seen: list[int] = []
    b1 = slidedp.train(_config(data, b_out, checkpoint={"interval": 0, "keep": 2}, **variant),
                       on_step=lambda r: seen.append(r["step"]),
                       should_stop=lambda: "save" if seen and seen[-1] >= 2 else False)
    after_stop = {"checkpoints": [os.path.basename(p) for p in ckpt.list_checkpoints(os.path.join(b_out,
                                                                                                 "checkpoints"))],
                  "metrics": read_metrics(b_out)}
    k = b1.steps_done
    # read now: the resumed leg keeps only its newest two checkpoints, which drops step k when k is odd
    after_stop["meta"] = ckpt.read_meta(os.path.join(b_out, "checkpoints", f"step-{k:08d}"))
    # What a run killed mid-way leaves behind: a metrics line of a step no checkpoint holds (and one cut short),
    # a temporary checkpoint directory of a dead writer, and a step directory whose arrays were never finished.
    b_ckpts = os.path.join(b_out, "checkpoints")
    a_record = next(r for r in read_metrics(a_out) if r["step"] == k + 1)
    with open(os.path.join(b_out, "metrics.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps({**a_record, "loss": 99.0}) + "\n" + '{"step": ')
    stale_tmp = os.path.join(b_ckpts, f"{ckpt.TMP_PREFIX}{k + 1:08d}-{_dead_pid()}")
    shutil.copytree(os.path.join(b_ckpts, f"step-{k:08d}"), stale_tmp)
    partial = os.path.join(b_ckpts, f"step-{k + 1:08d}")
    shutil.copytree(os.path.join(b_ckpts, f"step-{k:08d}"), partial)
    with open(os.path.join(partial, "exp_avg.f32"), "r+b") as fh:
        fh.truncate(100)

    logs: list[str] = []
    b2 = slidedp.train(_config(data, b_out, resume=True, **variant), on_log=logs.append)
    return {"variant": variant, "root": root, "data": data, "A": a, "B1": b1, "B2": b2, "a_out": a_out, "b_out": b_out,
            "after_stop": after_stop, "logs": logs, "stale_tmp": stale_tmp, "partial": partial}


def test_stop_and_save_writes_the_last_finished_step(runs):
    b1, stop = runs["B1"], runs["after_stop"]
    assert b1.status == "stopped" and 3 <= b1.steps_done < STEPS
    assert [r["step"] for r in stop["metrics"]] == list(range(1, b1.steps_done + 1))
    assert stop["checkpoints"] == [f"step-{b1.steps_done:08d}"]  # and none from the interval, which is 0 here
    meta = stop["meta"]
    assert meta["step"] == b1.steps_done
    # 4 rows per step from a 10-row stream: the position after step k
    epoch, position = divmod(4 * b1.steps_done, ROWS)
    assert meta["data_state"] == {"epoch": epoch, "position": position, "num_rows": ROWS}


def test_resume_is_bit_exact_with_the_uninterrupted_run(runs):
    assert_resume_bit_exact(runs)


def assert_resume_bit_exact(runs: dict) -> None:
    model = runs["variant"].get("model", "tiny-qwen3")
    a, b2 = runs["A"], runs["B2"]
    k = runs["B1"].steps_done
    assert a.status == "completed" and b2.status == "completed" and b2.steps_done == STEPS
    assert any(f"resumed from step {k} " in line for line in runs["logs"]), runs["logs"]
    final_a = os.path.join(runs["a_out"], "checkpoints", f"step-{STEPS:08d}")
    final_b = os.path.join(runs["b_out"], "checkpoints", f"step-{STEPS:08d}")
    ta, tb = slidedp_tensors(final_a, model), slidedp_tensors(final_b, model)
    for kind in ckpt.KINDS:
        for name, t in ta[kind].items():
            assert torch.equal(t, tb[kind][name]), f"{kind} of {name} differs after resume"
        with open(os.path.join(final_a, f"{kind}.f32"), "rb") as fa, open(os.path.join(final_b, f"{kind}.f32"),
                                                                         "rb") as fb:
            assert fa.read() == fb.read()
    assert ckpt.read_meta(final_a)["data_state"] == ckpt.read_meta(final_b)["data_state"]
    # the run is not trivially equal: weights moved and the schedule and clipping were exercised
    start = slidedp_tensors(os.path.join(runs["a_out"], "checkpoints", f"step-{4:08d}"), model)
    name = "model.embed_tokens.weight"
    assert not torch.equal(start["master"][name], ta["master"][name])
    ma, mb = read_metrics(runs["a_out"]), read_metrics(runs["b_out"])
    assert len({m["lr"] for m in ma}) == STEPS and any(m["clipped"] for m in ma)
    for ra, rb in zip(ma, mb):
        assert (ra["step"], ra["loss"], ra["grad_norm"], ra["lr"], ra["clipped"]) == \
               (rb["step"], rb["loss"], rb["grad_norm"], rb["lr"], rb["clipped"])


def test_resume_rewrites_metrics_once_per_step(runs):
    steps = [m["step"] for m in read_metrics(runs["b_out"])]
    assert steps == list(range(1, STEPS + 1))
    assert 99.0 not in [m["loss"] for m in read_metrics(runs["b_out"])]


def test_resume_skips_unfinished_checkpoints_and_keeps_the_last_m(runs):
    # keep 2: A wrote steps 2, 4, 6 and kept the last two; B's leftovers were never resumed from and are gone
    assert sorted(os.listdir(os.path.join(runs["a_out"], "checkpoints"))) == ["step-00000004", "step-00000006"]
    assert not os.path.exists(runs["stale_tmp"])
    names = sorted(os.listdir(os.path.join(runs["b_out"], "checkpoints")))
    assert names[-1] == f"step-{STEPS:08d}" and len(names) == 2
    if os.path.exists(runs["partial"]):  # only when it is the last step, written again, complete
        assert ckpt.is_complete(runs["partial"])


def test_resume_from_another_model_shape_is_a_config_error(runs, tmp_path):
    out = str(tmp_path / "other")
    shutil.copytree(os.path.join(runs["a_out"], "checkpoints"), os.path.join(out, "checkpoints"))
    with pytest.raises(ConfigError) as err:
        slidedp.train(_config(runs["data"], out, model="tiny-qwen3-tied", resume=True, **runs["variant"]))
    assert err.value.errors[0]["loc"] == "resume"
    assert "another model shape" in str(err.value) and "'tiny-qwen3'" in str(err.value)
    # the checkpoint it refused is left as it was
    assert ckpt.latest(os.path.join(out, "checkpoints")).endswith(f"step-{STEPS:08d}")


# ---------------------------------------------------------------------------------------- mechanics on a real
# host state (shared memory), without training


@pytest.fixture
def host_state(tmp_path, monkeypatch):
    from slidedp.step.host_state import HostLayout, HostState, unlink

    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    layout = HostLayout(run=f"slidedp-test-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[300, 1000, 700], world=1, delivery_dtype="float32", staging_slots=2,
                        hold_gradient=False)
    state = HostState.create(layout)
    gen = torch.Generator().manual_seed(0)
    state.master.copy_(torch.randn(layout.total, generator=gen))
    state.exp_avg.copy_(torch.randn(layout.total, generator=gen))
    state.exp_avg_sq.copy_(torch.rand(layout.total, generator=gen))
    yield state
    unlink(layout)


def _job(tmp_path) -> JobConfig:
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": str(tmp_path / "d.jsonl")},
                                "output_dir": str(tmp_path / "out")})


def _snapshot(state) -> dict[str, torch.Tensor]:
    return {k: getattr(state, k).clone() for k in ckpt.KINDS}


def test_save_keeps_the_last_m_and_loads_back_exactly(host_state, tmp_path):
    root, cfg = str(tmp_path / "ck"), _job(tmp_path)
    saved = {}
    for step in range(1, 6):
        host_state.master.add_(1.0)
        saved[step] = _snapshot(host_state)
        ckpt.save(root, step, cfg, host_state, {"epoch": 0, "position": step, "num_rows": 10}, keep=3)
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(root)] == [3, 4, 5]
    assert sorted(os.listdir(root)) == ["step-00000003", "step-00000004", "step-00000005"]
    step, data_state = ckpt.load(os.path.join(root, "step-00000004"), cfg, host_state)
    assert step == 4 and data_state == {"epoch": 0, "position": 4, "num_rows": 10}
    for kind, t in saved[4].items():
        assert torch.equal(getattr(host_state, kind), t), kind


def test_failed_write_leaves_the_previous_checkpoint(host_state, tmp_path, monkeypatch):
    root, cfg = str(tmp_path / "ck"), _job(tmp_path)
    good = _snapshot(host_state)
    ckpt.save(root, 1, cfg, host_state, None, keep=2)
    ckpt.save(root, 2, cfg, host_state, None, keep=2)
    host_state.master.mul_(3.0)
    written: list[str] = []
    real_write = ckpt._write_array

    def write_then_fail(path, flat):
        if written:  # the first array lands, the second write dies half-way (a full disk, a kill)
            with open(path, "wb") as fh:
                fh.write(b"\0" * 64)
            raise OSError(28, "No space left on device")
        written.append(path)
        real_write(path, flat)

    monkeypatch.setattr(ckpt, "_write_array", write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(root, 3, cfg, host_state, None, keep=2)
    # ... and writing a step that already exists again must not lose the one on disk either
    written.clear()
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(root, 2, cfg, host_state, None, keep=2)
    assert sorted(os.listdir(root)) == ["step-00000001", "step-00000002"]  # no step 3, no temporary left
    assert ckpt.latest(root).endswith("step-00000002")
    ckpt.load(ckpt.latest(root), cfg, host_state)
    for kind, t in good.items():
        assert torch.equal(getattr(host_state, kind), t), kind


def test_leftover_temporary_or_partial_directories_are_never_latest(host_state, tmp_path):
    root, cfg = str(tmp_path / "ck"), _job(tmp_path)
    ckpt.save(root, 1, cfg, host_state, None, keep=5)
    one = os.path.join(root, "step-00000001")
    # a complete-looking temporary directory of a killed writer, a step directory without meta.json, one with
    # meta.json but a short array, and one whose meta.json is cut short
    dead_tmp = os.path.join(root, f"{ckpt.TMP_PREFIX}00000009-{_dead_pid()}")
    shutil.copytree(one, dead_tmp)
    for step, damage in ((5, "no-meta"), (6, "short-array"), (7, "bad-meta")):
        d = os.path.join(root, f"step-{step:08d}")
        shutil.copytree(one, d)
        if damage == "no-meta":
            os.unlink(os.path.join(d, "meta.json"))
        elif damage == "short-array":
            with open(os.path.join(d, "master.f32"), "r+b") as fh:
                fh.truncate(os.path.getsize(os.path.join(d, "master.f32")) - 4)
        else:
            with open(os.path.join(d, "meta.json"), "r+b") as fh:
                fh.truncate(20)
    assert ckpt.latest(root) == one
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(root)] == [1]
    # the next save clears what dead writers left
    ckpt.save(root, 2, cfg, host_state, None, keep=5)
    assert sorted(os.listdir(root)) == ["step-00000001", "step-00000002"]


def test_free_disk_is_checked_before_writing(host_state, tmp_path, monkeypatch):
    root, cfg = str(tmp_path / "ck"), _job(tmp_path)
    ckpt.save(root, 1, cfg, host_state, None, keep=2)
    need = ckpt.checkpoint_bytes(host_state.layout.total)
    usage = shutil.disk_usage(root)
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: usage._replace(free=need // 2))
    with pytest.raises(OSError) as err:
        ckpt.save(root, 2, cfg, host_state, None, keep=2)
    msg = str(err.value)
    assert "checkpoint of step 2" in msg and "GiB" in msg
    # the job's checkpoint.interval is 0 (the default): the advice is not to set what it already has
    assert "checkpoint.interval is 0 already" in msg and "set checkpoint.interval to 0" not in msg
    assert os.listdir(root) == ["step-00000001"]


def test_a_job_whose_checkpoint_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    data = make_token_data(str(tmp_path / "d.jsonl"), rows=4, seq_len=SEQ)
    usage = shutil.disk_usage(str(tmp_path))
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: usage._replace(free=100_000))
    with pytest.raises(ConfigError) as err:
        slidedp.train(_config(data, str(tmp_path / "out"), ranks=1))
    assert err.value.errors[0]["loc"] == "checkpoint.interval"
    assert "only 0.00 GiB free" in str(err.value) and "checkpoint.interval to 0" in str(err.value)


def test_clear_removes_every_checkpoint_of_an_earlier_run(host_state, tmp_path):
    root, cfg = str(tmp_path / "ck"), _job(tmp_path)
    ckpt.save(root, 1, cfg, host_state, None, keep=2)
    os.makedirs(os.path.join(root, f"{ckpt.TMP_PREFIX}00000002-1"))
    assert len(ckpt.clear(root)) == 2 and os.listdir(root) == []
