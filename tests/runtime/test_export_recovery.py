"""Nothing finished is lost: a failed export keeps the trained state in a checkpoint, and exports again from it.

- export_hf checks free disk first, and on any failure removes final.tmp, leaves the previous final/ as it was
  and raises ExportError(needed_bytes, free_bytes, directory); it returns the files it wrote with their sizes.
- train() whose export fails after the last step writes a checkpoint of that step (when none exists), keeps every
  checkpoint, and raises ExportFailed naming it; `export_checkpoint` (and `slidedp export --checkpoint`) then
  writes the same final/ a normal export gives, reading the checkpoint only; a resume from a checkpoint of the
  last step goes straight to the export, starting no rank.
- Checkpoint rotation never removes the last good checkpoint when the newest save fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import slidedp  # noqa: E402
from slidedp import cli  # noqa: E402
from slidedp.config import JobConfig  # noqa: E402
from slidedp.launch import ExportFailed  # noqa: E402
from slidedp.persist import checkpoint as ckpt  # noqa: E402
from slidedp.persist import export  # noqa: E402
from slidedp.persist.export import ExportError, export_checkpoint  # noqa: E402
from slidedp.run_spec import CheckpointSteps  # noqa: E402

from tests.runtime.exactness import export_tensors, make_token_data, seeded_host_state, slidedp_tensors  # noqa: E402

STEPS, SEQ = 3, 32


def _config(data: str, out: str, **over) -> dict:
    cfg = {
        "model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": SEQ, "micro_batch_size": 2,
        "steps": STEPS, "ranks": 1, "precision": "bf16", "output_dir": out, "optimizer": {"lr": 1e-2},
        "checkpoint": {"interval": 0, "keep": 2}, "cpu_threads": 1,
        "policy": {"delivery": "replicated", "grad_reduce": "host", "activations": "checkpoint", "resident_units": 0},
    }
    cfg.update(over)
    return cfg


def _listing(path: str) -> list[dict]:
    return [{"name": n, "bytes": os.path.getsize(os.path.join(path, n))} for n in sorted(os.listdir(path))]


def _digest(directory: str) -> dict[str, str]:
    return {n: hashlib.sha256(open(os.path.join(directory, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(directory))}


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """N: a normal run (checkpoint of the last step, export). F: the same run whose export hits a full disk."""
    root = tmp_path_factory.mktemp("recovery")
    data = make_token_data(str(root / "data.jsonl"), rows=12, seq_len=SEQ, seed=9)
    n_out, f_out = str(root / "N"), str(root / "F")
    normal = slidedp.train(_config(data, n_out, checkpoint={"interval": STEPS, "keep": 1}))
    mp = pytest.MonkeyPatch()
    mp.setattr("safetensors.torch.save_file", _disk_full)
    logs: list[str] = []
    try:
        with pytest.raises(ExportFailed) as failed:
            slidedp.train(_config(data, f_out), on_log=logs.append)
    finally:
        mp.undo()
    return {"root": root, "data": data, "N": normal, "n_out": n_out, "f_out": f_out, "failed": failed.value,
            "logs": logs}


@pytest.mark.slow
def test_a_normal_export_lists_the_files_it_wrote(runs):
    n = runs["N"]
    assert n.status == "completed" and n.final_dir == os.path.join(runs["n_out"], "final")
    assert n.exported_files == _listing(n.final_dir)
    names = [f["name"] for f in n.exported_files]
    assert {"model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
            "tokenizer.json"} <= set(names)
    assert all(isinstance(f["bytes"], int) and f["bytes"] > 0 for f in n.exported_files)


def test_a_full_disk_at_the_export_keeps_the_trained_state(runs):
    err, f_out = runs["failed"], runs["f_out"]
    last = os.path.join(f_out, "checkpoints", f"step-{STEPS:08d}")
    assert err.checkpoint == last and ckpt.is_complete(last)
    assert ckpt.read_meta(last)["step"] == STEPS
    assert isinstance(err.export_error, ExportError)
    assert err.export_error.directory == f_out and err.export_error.needed_bytes > 0
    msg = str(err)
    assert f"all {STEPS} steps trained" in msg and "No space left on device" in msg
    assert f"needs {export.format_bytes(err.export_error.needed_bytes)} in {f_out}" in msg
    assert f"slidedp export --checkpoint {last}" in msg
    assert not os.path.exists(os.path.join(f_out, "final.tmp")) and not os.path.exists(os.path.join(f_out, "final"))
    assert any("export failed" in line for line in runs["logs"])
    # the exception survives pickling (a job process hands it on) with its fields
    again = pickle.loads(pickle.dumps(err))
    assert again.checkpoint == last and str(again) == msg


def test_export_checkpoint_gives_the_normal_export(runs):
    n_final = runs["N"].final_dir
    last = runs["failed"].checkpoint
    before = _digest(last)
    out = export_checkpoint(last)  # default: the run's own final/
    assert out["final_dir"] == os.path.join(runs["f_out"], "final")
    assert out["files"] == _listing(out["final_dir"])
    assert [f["name"] for f in out["files"]] == [f["name"] for f in runs["N"].exported_files]
    expected, got = export_tensors(n_final), export_tensors(out["final_dir"])
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert t.dtype == torch.bfloat16 and torch.equal(got[name], t), name
    for name in ("config.json", "model.safetensors.index.json", "generation_config.json", "tokenizer.json"):
        with open(os.path.join(n_final, name), "rb") as a, open(os.path.join(out["final_dir"], name), "rb") as b:
            assert a.read() == b.read(), name
    assert _digest(last) == before  # only read
    assert not os.path.exists(out["final_dir"] + ".tmp")


def test_export_checkpoint_equals_export_hf_of_the_same_state(runs, tmp_path):
    """The normal run's own checkpoint exported from disk gives its final/ exactly: one writer, two sources."""
    n_ckpt = os.path.join(runs["n_out"], "checkpoints", f"step-{STEPS:08d}")
    out = export_checkpoint(n_ckpt, str(tmp_path / "again"))
    expected, got = export_tensors(runs["N"].final_dir), export_tensors(out["final_dir"])
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert torch.equal(got[name], t), name
    master = slidedp_tensors(n_ckpt, "tiny-qwen3")["master"]
    for name, t in master.items():
        assert torch.equal(got[name], t.to(torch.bfloat16)), name


def test_cli_export(runs, tmp_path, capsys):
    last = runs["failed"].checkpoint
    rc = cli.main(["export", "--checkpoint", last, "--out", str(tmp_path / "cli-final")])
    printed = json.loads(capsys.readouterr().out)
    assert rc == 0 and printed["final_dir"] == str(tmp_path / "cli-final")
    assert printed["files"] == _listing(str(tmp_path / "cli-final"))
    broken = str(tmp_path / "broken" / "step-00000003")
    shutil.copytree(last, broken)
    os.unlink(os.path.join(broken, "meta.json"))
    rc = cli.main(["export", "--checkpoint", broken])
    err = capsys.readouterr().err
    assert rc == 2 and "not a complete checkpoint" in err and broken in err
    assert not os.path.exists(os.path.join(str(tmp_path / "broken"), "..", "final"))


def test_resuming_at_the_last_step_only_exports(runs, tmp_path, monkeypatch):
    out = str(tmp_path / "retry")
    shutil.copytree(os.path.join(runs["f_out"], "checkpoints"), os.path.join(out, "checkpoints"))
    import slidedp.ranks as ranks

    popen = ranks.subprocess.Popen

    def no_rank(args, *rest, **kwargs):
        if any("slidedp.ranks" in str(a) for a in (args if isinstance(args, (list, tuple)) else [args])):
            raise AssertionError("a rank process was started")
        return popen(args, *rest, **kwargs)  # planning's own probes (the topology's child) still run

    monkeypatch.setattr(ranks.subprocess, "Popen", no_rank)  # what slidedp.ranks.Launch starts them with
    logs: list[str] = []
    result = slidedp.train(_config(runs["data"], out, resume=True), on_log=logs.append)
    assert result.status == "completed" and result.steps_done == STEPS and result.metrics == []
    assert result.exported_files == _listing(result.final_dir)
    expected, got = export_tensors(runs["N"].final_dir), export_tensors(result.final_dir)
    for name, t in expected.items():
        assert torch.equal(got[name], t), name
    assert any("no step to run" in line for line in logs)


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_a_failed_export_keeps_every_checkpoint(runs, tmp_path, monkeypatch):
    """Checkpoints of steps 1 and 2 (keep 1 would prune), a resumed leg without interval: the step-3 checkpoint
    written for the failed export is added, nothing is removed."""
    out = str(tmp_path / "keep")
    slidedp.train(_config(runs["data"], out, steps=2, export=False, checkpoint={"interval": 1, "keep": 2}))
    root = os.path.join(out, "checkpoints")
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(root)] == [1, 2]
    monkeypatch.setattr("safetensors.torch.save_file", _disk_full)
    with pytest.raises(ExportFailed) as failed:
        slidedp.train(_config(runs["data"], out, resume=True, checkpoint={"interval": 0, "keep": 1}))
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(root)] == [1, 2, 3]
    assert failed.value.checkpoint == os.path.join(root, "step-00000003")


def test_an_export_failure_whose_state_cannot_be_kept_says_so(runs, tmp_path, monkeypatch):
    out = str(tmp_path / "lost")
    monkeypatch.setattr("safetensors.torch.save_file", _disk_full)

    def no_room(*args, **kwargs):
        raise OSError("checkpoint of step 3 needs 1.00 GiB in X, only 0.00 GiB free")

    monkeypatch.setattr(ckpt, "save", no_room)
    with pytest.raises(ExportFailed) as failed:
        slidedp.train(_config(runs["data"], out))
    assert failed.value.checkpoint is None
    assert "could not be kept" in str(failed.value) and "only 0.00 GiB free" in str(failed.value)
    assert not os.path.exists(os.path.join(out, "final.tmp"))


# ---------------------------------------------------------------------------------------- export_hf on its own


@pytest.fixture
def host_state(tmp_path, monkeypatch):
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    with seeded_host_state(adapter, str(tmp_path / "shm"), "slidedp-export-recovery") as state:
        yield adapter, state


def _cfg(tmp_path) -> JobConfig:
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}, "precision": "fp32",
                                "output_dir": str(tmp_path / "run")})


def test_too_little_disk_is_refused_before_writing(host_state, tmp_path, monkeypatch):
    adapter, state = host_state
    cfg = _cfg(tmp_path)
    final = str(tmp_path / "run" / "final")
    previous = export.export_hf(final, cfg, adapter, state)
    before = _digest(final)
    monkeypatch.setattr(export, "_free_bytes", lambda directory: 12345)
    with pytest.raises(ExportError) as err:
        export.export_hf(final, cfg, adapter, state)
    e = err.value
    params = sum(u.numel for u in adapter.units)
    assert e.needed_bytes >= params * 4 + 2**20 and e.free_bytes == 12345 and e.directory == str(tmp_path / "run")
    assert f"needs {export.format_bytes(e.needed_bytes)} in {tmp_path / 'run'}" in str(e)
    assert "0.0 MiB is free" in str(e)
    assert isinstance(e, OSError)
    assert _digest(final) == before and previous["files"] == _listing(final)
    assert sorted(os.listdir(tmp_path / "run")) == ["final"]


def test_any_failure_mid_write_removes_the_temporary_and_keeps_the_previous_export(host_state, tmp_path,
                                                                                   monkeypatch):
    adapter, state = host_state
    cfg = _cfg(tmp_path)
    final = str(tmp_path / "run" / "final")
    export.export_hf(final, cfg, adapter, state)
    before = _digest(final)
    monkeypatch.setattr(export, "SHARD_BYTES", 100_000)  # several shards: the second one fails
    import safetensors.torch

    real = safetensors.torch.save_file
    calls: list[str] = []

    def second_fails(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            with open(path, "wb") as fh:
                fh.write(b"\0" * 100)
            raise OSError(28, "No space left on device")
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", second_fails)
    with pytest.raises(ExportError) as err:
        export.export_hf(final, cfg, adapter, state)
    assert "No space left on device" in str(err.value) and "needs" in str(err.value)
    assert isinstance(err.value.__cause__, OSError)
    assert sorted(os.listdir(tmp_path / "run")) == ["final"]  # no final.tmp, no final.old
    assert _digest(final) == before
    # an error that is not an OSError is reported the same way
    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(ExportError, match="ValueError: bad"):
        export.export_hf(final, cfg, adapter, state)
    assert sorted(os.listdir(tmp_path / "run")) == ["final"] and _digest(final) == before


def test_export_hf_takes_an_iterable_of_unit_tensors(host_state, tmp_path):
    adapter, state = host_state
    cfg = _cfg(tmp_path)
    a = export.export_hf(str(tmp_path / "a"), cfg, adapter, state)
    b = export.export_hf(str(tmp_path / "b"), cfg, adapter, (state.master_unit(s.index).clone() for s in adapter.units))
    assert a["files"] == b["files"]
    ta, tb = export_tensors(a["final_dir"]), export_tensors(b["final_dir"])
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    with pytest.raises(ExportError, match="unit 1"):
        export.export_hf(str(tmp_path / "c"), cfg, adapter, iter([state.master_unit(0)]))
    assert not os.path.exists(str(tmp_path / "c.tmp")) and not os.path.exists(str(tmp_path / "c"))


# ---------------------------------------------------------------------------------------- checkpoint rotation


@pytest.fixture
def small_state(tmp_path, monkeypatch):
    from slidedp.step.host_state import HostLayout, HostState, unlink

    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(tmp_path / "shm"))
    layout = HostLayout(run=f"slidedp-rotation-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[300, 1000, 700], world=1, delivery_dtype="float32", staging_slots=2,
                        hold_gradient=False)
    state = HostState.create(layout)
    state.master.copy_(torch.randn(layout.total, generator=torch.Generator().manual_seed(1)))
    yield state
    unlink(layout)


def test_rotation_never_removes_the_last_good_checkpoint(small_state, tmp_path, monkeypatch):
    root = str(tmp_path / "ck")
    cfg = JobConfig.from_dict({"model": "tiny-qwen3", "data": {"path": "d.jsonl"}, "output_dir": str(tmp_path)})
    ckpt.save(root, 1, cfg, small_state, None, keep=1)
    good = _digest(os.path.join(root, "step-00000001"))
    real = ckpt._write_array
    written: list[str] = []

    def fail_after_first(path, flat):
        if written:
            raise OSError(28, "No space left on device")
        written.append(path)
        real(path, flat)

    monkeypatch.setattr(ckpt, "_write_array", fail_after_first)
    small_state.master.add_(1.0)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(root, 2, cfg, small_state, None, keep=1)
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(root)] == [1]
    assert ckpt.is_complete(os.path.join(root, "step-00000001"))
    assert _digest(os.path.join(root, "step-00000001")) == good
    assert os.listdir(root) == ["step-00000001"]
    # rewriting that same step, failing half-way, keeps it too
    written.clear()
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(root, 1, cfg, small_state, None, keep=1)
    assert os.listdir(root) == ["step-00000001"] and _digest(os.path.join(root, "step-00000001")) == good


def test_checkpoint_steps_answer_as_the_list_did():
    for start in range(0, 5):
        for steps in range(start, 12):
            for interval in range(0, 6):
                listed = [s for s in range(start + 1, steps + 1) if interval and s % interval == 0]
                if interval and steps not in listed and steps > start:
                    listed.append(steps)
                held = CheckpointSteps(start, steps, interval)
                assert [s for s in range(0, steps + 3) if s in held] == listed, (start, steps, interval)
    huge = CheckpointSteps(0, 10**9, 1)
    assert 10**9 in huge and 0 not in huge and len(pickle.dumps(huge)) < 200
