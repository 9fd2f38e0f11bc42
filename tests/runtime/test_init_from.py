"""init_from: a run that starts from an earlier run's checkpoint trains exactly as one started from those weights.

Run A trains 4 steps and checkpoints step 4 (and exports it: fp32, so final/ holds the step-4 master bit for
bit). Run B starts with `init_from: {checkpoint: A's step 4}` in another output_dir; run C starts from A's
exported final/ as its model directory. B and C see the same batches with the same weights, zero AdamW moments
and step counts from 1, so their losses, gradient norms and checkpoints are equal bit for bit; B's first loss is
A's trained model on the first batch (lower than A's own first loss). A's checkpoint is never written. With
resume true and a checkpoint of B's own, B resumes that instead (run D) and continues exactly as C does.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import slidedp  # noqa: E402
from slidedp.config import ConfigError, JobConfig  # noqa: E402
from slidedp.persist import checkpoint as ckpt  # noqa: E402
from slidedp.validation import validate_job  # noqa: E402

from tests.runtime.exactness import make_token_data, read_metrics  # noqa: E402

pytestmark = pytest.mark.slow  # its fixture trains three runs: make test, not make test-fast

SEQ = 32


def _config(data: str, out: str, **over) -> dict:
    cfg = {
        "model": "tiny-qwen3", "data": {"path": data, "format": "tokens", "shuffle": False},
        "seq_len": SEQ, "micro_batch_size": 2, "steps": 4, "ranks": 1, "precision": "fp32", "output_dir": out,
        "optimizer": {"lr": 1e-2, "weight_decay": 0.05}, "cpu_threads": 1, "export": False,
        "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint", "resident_units": 0},
        "checkpoint": {"interval": 2, "keep": 2},
    }
    cfg.update(over)
    return cfg


def _digest(directory: str) -> dict[str, str]:
    return {n: hashlib.sha256(open(os.path.join(directory, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(directory))}


def _same_checkpoint(a: str, b: str) -> None:
    for kind in ckpt.KINDS:
        with open(os.path.join(a, f"{kind}.f32"), "rb") as fa, open(os.path.join(b, f"{kind}.f32"), "rb") as fb:
            assert fa.read() == fb.read(), kind


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("init_from")
    data = make_token_data(str(root / "data.jsonl"), rows=16, seq_len=SEQ, seed=11)
    a_out = str(root / "A")
    a = slidedp.train(_config(data, a_out, export=True, checkpoint={"interval": 4, "keep": 1}))
    source = os.path.join(a_out, "checkpoints", "step-00000004")
    before = _digest(source)

    # B: A's weights through init_from; resume is on (as a retried job has it), but B has no checkpoint yet
    b_out = str(root / "B")
    b_cfg = _config(data, b_out, steps=2, resume=True, init_from={"checkpoint": source, "job": None})
    b_logs: list[str] = []
    b = slidedp.train(b_cfg, on_log=b_logs.append)
    # C: the same weights as a model directory (A's fp32 export)
    c_out = str(root / "C")
    c = slidedp.train(_config(data, c_out, model=a.final_dir, steps=3))
    # D: B run again for 3 steps: its own step-2 checkpoint wins over init_from
    d_logs: list[str] = []
    d = slidedp.train({**b_cfg, "steps": 3}, on_log=d_logs.append)
    return {"root": root, "data": data, "source": source, "before": before, "A": a, "B": b, "C": c, "D": d,
            "a_out": a_out, "b_out": b_out, "c_out": c_out, "b_logs": b_logs, "d_logs": d_logs}


def test_init_from_starts_from_the_checkpoint_weights_exactly(runs):
    a, b, c = runs["A"], runs["B"], runs["C"]
    assert a.status == b.status == c.status == "completed"
    assert any("initial weights from step 4 of" in line for line in runs["b_logs"]), runs["b_logs"]
    mb, mc, ma = b.metrics, read_metrics(runs["c_out"]), read_metrics(runs["a_out"])  # B's file now holds D's step too
    assert [m["step"] for m in mb] == [1, 2]  # the step count starts again
    for rb, rc in zip(mb, mc[:2]):
        assert (rb["loss"], rb["grad_norm"], rb["lr"]) == (rc["loss"], rc["grad_norm"], rc["lr"])
    # the first batch again (fresh data order), now seen by A's trained weights: not A's own first loss
    assert mb[0]["loss"] < ma[0]["loss"] - 0.05
    # weights, and moments that started at zero, equal bit for bit after two steps
    _same_checkpoint(os.path.join(runs["b_out"], "checkpoints", "step-00000002"),
                     os.path.join(runs["c_out"], "checkpoints", "step-00000002"))
    meta = ckpt.read_meta(os.path.join(runs["b_out"], "checkpoints", "step-00000002"))
    assert meta["step"] == 2 and meta["config"]["init_from"]["checkpoint"] == runs["source"]


def test_the_source_checkpoint_is_never_written(runs):
    assert _digest(runs["source"]) == runs["before"]
    assert ckpt.list_checkpoints(os.path.join(runs["a_out"], "checkpoints")) == [runs["source"]]


def test_resuming_its_own_checkpoint_wins_over_init_from(runs):
    d = runs["D"]
    assert d.status == "completed" and d.steps_done == 3
    assert any("resumed from step 2 " in line for line in runs["d_logs"]), runs["d_logs"]
    assert any("init_from" in line and "not used" in line for line in runs["d_logs"])
    assert not any("initial weights from" in line for line in runs["d_logs"])
    md, mc = read_metrics(runs["b_out"]), read_metrics(runs["c_out"])
    assert [m["step"] for m in md] == [1, 2, 3]
    assert [(m["loss"], m["grad_norm"]) for m in md] == [(m["loss"], m["grad_norm"]) for m in mc]
    _same_checkpoint(os.path.join(runs["b_out"], "checkpoints", "step-00000003"),
                     os.path.join(runs["c_out"], "checkpoints", "step-00000003"))
    assert _digest(runs["source"]) == runs["before"]


def test_a_job_id_is_for_the_web_service_to_resolve(runs, tmp_path):
    cfg = _config(runs["data"], str(tmp_path / "out"), init_from={"job": 7})
    JobConfig.from_dict(cfg)  # a valid config ...
    assert validate_job(JobConfig.from_dict(cfg)) == []  # ... which validation leaves to the web service
    # with a job, `checkpoint` is the web service's name for one of that job's checkpoints, not a path
    named = _config(runs["data"], str(tmp_path / "out"), init_from={"job": 7, "checkpoint": "latest"})
    assert validate_job(JobConfig.from_dict(named)) == []
    with pytest.raises(ConfigError) as err:
        slidedp.train(cfg)
    assert err.value.errors[0]["loc"] == "init_from.job"
    assert "checkpoint" in err.value.errors[0]["msg"] and "path" in err.value.errors[0]["msg"]
    assert not os.path.exists(str(tmp_path / "out"))  # refused before anything was written


def test_another_model_shape_is_refused(runs, tmp_path):
    cfg = _config(runs["data"], str(tmp_path / "out"), model="tiny-qwen3-tied",
                  init_from={"checkpoint": runs["source"]})
    with pytest.raises(ConfigError) as err:
        slidedp.train(cfg)
    assert err.value.errors[0]["loc"] == "init_from.checkpoint"
    assert "another model shape" in str(err.value) and "'tiny-qwen3'" in str(err.value)
    # and the check the launcher makes against the model it built
    with pytest.raises(ConfigError) as err:
        ckpt.check_init_from(runs["source"], str(tmp_path / "out"), [10, 20])
    assert err.value.errors[0]["loc"] == "init_from.checkpoint"


def test_missing_or_incomplete_sources_are_validation_errors(runs, tmp_path):
    missing = _config(runs["data"], str(tmp_path / "out"), init_from={"checkpoint": str(tmp_path / "nope")})
    errors = validate_job(JobConfig.from_dict(missing))
    assert [e["loc"] for e in errors] == ["init_from.checkpoint"] and "does not exist" in errors[0]["msg"]
    partial = str(tmp_path / "partial" / "step-00000004")
    shutil.copytree(runs["source"], partial)
    with open(os.path.join(partial, "master.f32"), "r+b") as fh:
        fh.truncate(1000)
    errors = validate_job(JobConfig.from_dict(_config(runs["data"], str(tmp_path / "out"),
                                                      init_from={"checkpoint": partial})))
    assert [e["loc"] for e in errors] == ["init_from.checkpoint"] and "not a complete checkpoint" in errors[0]["msg"]
    with pytest.raises(ConfigError) as err:
        slidedp.train(_config(runs["data"], str(tmp_path / "out"), init_from={"checkpoint": partial}))
    assert err.value.errors[0]["loc"] == "init_from.checkpoint"


def test_a_source_inside_the_jobs_own_output_dir_is_refused_and_kept(runs, tmp_path):
    out = str(tmp_path / "out")
    inside = os.path.join(out, "checkpoints", "step-00000004")
    shutil.copytree(runs["source"], inside)
    before = _digest(inside)
    cfg = _config(runs["data"], out, init_from={"checkpoint": inside})
    errors = validate_job(JobConfig.from_dict(cfg))
    assert [e["loc"] for e in errors] == ["init_from.checkpoint"] and "inside this job's output_dir" in \
        errors[0]["msg"]
    with pytest.raises(ConfigError) as err:
        slidedp.train(cfg)
    assert err.value.errors[0]["loc"] == "init_from.checkpoint"
    assert _digest(inside) == before and ckpt.is_complete(inside)  # a fresh run's clear never reached it
    # the same through a path that only resolves inside (a symlink to the output_dir)
    link = str(tmp_path / "link")
    os.symlink(out, link)
    cfg = _config(runs["data"], link, init_from={"checkpoint": inside})
    assert [e["loc"] for e in validate_job(JobConfig.from_dict(cfg))] == ["init_from.checkpoint"]


def test_load_weights_zeroes_the_moments_and_reads_only_the_master(runs, tmp_path, monkeypatch):
    from slidedp.step.host_state import HostLayout, HostState, unlink
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    layout = HostLayout(run=f"slidedp-init-test-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[u.numel for u in adapter.units], world=1, delivery_dtype="bfloat16",
                        staging_slots=2, hold_gradient=False)
    state = HostState.create(layout)
    opened: list[tuple[str, str]] = []
    real_open = open

    def spy(path, mode="r", *args, **kwargs):
        if str(path).startswith(runs["source"]):
            opened.append((os.path.basename(str(path)), mode))
        return real_open(path, mode, *args, **kwargs)

    try:
        state.exp_avg.fill_(3.0)
        state.exp_avg_sq.fill_(5.0)
        import builtins

        monkeypatch.setattr(builtins, "open", spy)
        step = ckpt.load_weights(runs["source"], state)
        monkeypatch.undo()
        assert step == 4
        master = torch.from_file(os.path.join(runs["source"], "master.f32"), shared=False, size=layout.total,
                                 dtype=torch.float32)
        assert torch.equal(state.master, master)
        assert torch.equal(state.delivery, master.to(torch.bfloat16))
        assert not state.exp_avg.any() and not state.exp_avg_sq.any()
    finally:
        unlink(layout)
    assert {name for name, _ in opened} <= {"meta.json", "master.f32"}
    assert all(mode in ("r", "rb") for _, mode in opened), opened
