"""Held-out evaluation (config `eval`): the loss of a plain torch forward, rows never trained on, training
unchanged by it, the best checkpoint kept, and clear config errors.

The runs are fp32 on two real gloo CPU ranks. An evaluation reads every rank's fixed batches of the evaluation set
through the window, forward only; its eval_loss is the mean token cross-entropy over their non-ignored targets,
which a transformers model loaded from the same weights must reproduce to the exactness suite's 1e-5.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import slidedp
import torch
from slidedp.config import ConfigError, JobConfig
from slidedp.schedule import eval_schedule, window_plan

from tests.runtime.exactness import (
    make_model_dir,
    make_pattern_data,
    make_token_data,
    read_metrics,
    read_rows,
)

SEQ, MBS = 24, 2
EVAL_ROWS = 7  # two evaluation batches of 2 ranks x 2 rows: the last rank's second micro-batch is padding


# ------------------------------------------------------------------------------------------------ config
BASE = {"model": "tiny-qwen3", "data": {"path": "unused.jsonl"}}


def _errors(raw: dict) -> list[dict]:
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(raw)
    return err.value.errors


def test_config_errors_name_the_eval_key():
    both = _errors({**BASE, "eval": {"path": "held.jsonl", "holdout": 0.1}})
    assert [e["loc"] for e in both] == ["eval.holdout"] and "eval.path" in both[0]["msg"]
    for value in (0.5, 0.9, -0.1):
        assert [e["loc"] for e in _errors({**BASE, "eval": {"holdout": value}})] == ["eval.holdout"]
    assert "less than 0.5" in _errors({**BASE, "eval": {"holdout": 0.5}})[0]["msg"]
    assert _errors({**BASE, "eval": {"interval": -1}})[0]["loc"] == "eval.interval"
    assert _errors({**BASE, "eval": {"max_batches": 0}})[0]["loc"] == "eval.max_batches"
    assert _errors({**BASE, "eval": {"path": " "}})[0]["loc"] == "eval.path"
    no_eval = _errors({**BASE, "eval": {"keep_best": True}, "checkpoint": {"interval": 2}})
    assert [e["loc"] for e in no_eval] == ["eval.keep_best"] and "eval.path or eval.holdout" in no_eval[0]["msg"]
    no_ckpt = _errors({**BASE, "eval": {"keep_best": True, "holdout": 0.1, "interval": 2}})
    assert no_ckpt[0]["loc"] == "eval.keep_best" and "checkpoint.interval" in no_ckpt[0]["msg"]
    for interval in (0, 3):
        off = _errors({**BASE, "eval": {"keep_best": True, "holdout": 0.1, "interval": interval},
                       "checkpoint": {"interval": 4}})
        assert off[0]["loc"] == "eval.keep_best" and "eval.interval" in off[0]["msg"], off
    ok = JobConfig.from_dict({**BASE, "eval": {"keep_best": True, "holdout": 0.1, "interval": 2},
                              "checkpoint": {"interval": 4}})
    assert ok.eval.enabled and ok.to_dict()["eval"]["keep_best"] is True
    assert not JobConfig.from_dict(BASE).eval.enabled


def test_validation_reads_the_eval_file_and_counts_the_holdout(tmp_path):
    from slidedp.validation import validate_job

    data = make_token_data(str(tmp_path / "train.jsonl"), rows=3, seq_len=SEQ)
    base = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": SEQ,
            "output_dir": str(tmp_path / "out")}
    assert validate_job(JobConfig.from_dict({**base, "eval": {"path": data}})) == []
    missing = validate_job(JobConfig.from_dict({**base, "eval": {"path": str(tmp_path / "nope.jsonl")}}))
    assert [e["loc"] for e in missing] == ["eval.path"] and "does not exist" in missing[0]["msg"]
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"input_ids": [5] * (SEQ - 1)}) + "\n", encoding="utf-8")
    wrong = validate_job(JobConfig.from_dict({**base, "eval": {"path": str(short)}}))
    assert [e["loc"] for e in wrong] == ["eval.path"] and "seq_len" in wrong[0]["msg"]
    assert validate_job(JobConfig.from_dict({**base, "eval": {"holdout": 0.3}})) == []
    one = make_token_data(str(tmp_path / "one.jsonl"), rows=1, seq_len=SEQ)
    none_left = validate_job(JobConfig.from_dict({**base, "data": {"path": one}, "eval": {"holdout": 0.1}}))
    assert [e["loc"] for e in none_left] == ["eval.holdout"]


# ------------------------------------------------------------------------------------------------ schedule
@pytest.mark.parametrize("layers,micro", [(1, 1), (4, 1), (4, 3)])
def test_the_eval_schedule_is_forward_only_and_fits_every_window(layers, micro):
    sched = eval_schedule(layers, micro)
    assert sched == [0, *range(1, layers + 1), layers + 1] + [u for _ in range(micro - 1) for u in
                                                             range(1, layers + 1)]
    for slots in (2, 3, 5):
        plan, _ = window_plan(sched, {0, layers + 1}, slots)
        assert [p[0] for p in plan].count("d") == 2  # the embedding and head, once each


# ------------------------------------------------------------------------------------------------ data
def _numbered(tmp_path, n, **kw):
    """Token rows whose ids all equal the row number + 5, so a batch shows which rows it holds."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [i + 5] * 8}) + "\n" for i in range(n)), encoding="utf-8")
    data = {"path": str(path), "format": "tokens", "shuffle": True, "seed": 3, **kw.pop("data", {})}
    return JobConfig.from_dict({"model": "tiny-qwen3", "data": data, "seq_len": 8, **kw})


def _rows_of(mb) -> list[int]:
    return [int(x) - 5 for x in mb.input_ids[:, 0]]


def test_held_out_rows_are_never_trained_on(tmp_path):
    from slidedp.data import DataPipeline

    n, world = 30, 2
    cfg = _numbered(tmp_path, n, micro_batch_size=2, grad_accum=2, eval={"holdout": 0.2, "max_batches": 100})
    pipes = [DataPipeline(cfg, None, r, world) for r in range(world)]
    mine = [{r for mb in p.eval_batches() for r, lab in zip(_rows_of(mb), mb.labels[:, 0]) if int(lab) != -100}
            for p in pipes]
    held = mine[0] | mine[1]
    assert not mine[0] & mine[1] and len(held) == 6  # each rank evaluates its own share of the held-out rows
    assert all(p.stats["eval_rows"] == 6 and p.stats["train_rows"] == 24 for p in pipes)
    assert {r for r in pipes[1].eval_rows.input_ids[:, 0].tolist()} == {r + 5 for r in held}  # split alike
    trained = []
    for _ in range(10):  # 10 steps x 8 rows = 80 rows of the stream: more than 3 epochs of the 24 left
        for p in pipes:
            trained += [r for mb in p.next_step() for r in _rows_of(mb)]
    assert not held & set(trained) and set(trained) == set(range(n)) - held
    state = pipes[1].state_dict()
    assert state["num_rows"] == 24
    with DataPipeline(cfg, None, 1, world) as resumed:  # the same split again: the stream resumes
        resumed.load_state_dict(state)
        assert resumed.next_step() is not None
    for p in pipes:
        p.close()
    other = DataPipeline(_numbered(tmp_path, n, eval={"holdout": 0.2}, data={"seed": 4}), None, 0, 1)
    assert {r for mb in other.eval_batches() for r in _rows_of(mb)} != held  # chosen by the data seed


def test_eval_batches_are_fixed_rank_strided_and_padded(tmp_path):
    from slidedp.data import DataPipeline

    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"input_ids": [i + 5] * 8}) + "\n" for i in range(5)), encoding="utf-8")
    cfg = _numbered(tmp_path, 12, micro_batch_size=2, eval={"path": str(held)})
    ranks = [DataPipeline(cfg, None, r, 2) for r in range(2)]
    batches = [p.eval_batches() for p in ranks]
    assert [len(b) for b in batches] == [2, 2]  # ceil(5 rows / (2 ranks x 2)), the same on every rank
    real = [[[r for r, lab in zip(_rows_of(mb), mb.labels[:, 0]) if int(lab) != -100] for mb in b] for b in batches]
    assert real == [[[0, 1], [4]], [[2, 3], []]]
    padding = batches[1][1]
    assert bool((padding.labels == -100).all()) and padding.input_ids.shape == (2, 8)
    assert ranks[0].eval_batches() is batches[0]  # the same batches at every evaluation
    capped = DataPipeline(_numbered(tmp_path, 12, micro_batch_size=2, eval={"path": str(held), "max_batches": 1}),
                          None, 0, 2)
    assert [_rows_of(mb) for mb in capped.eval_batches()] == [[0, 1]]
    assert ranks[0].stats["eval_rows"] == 5 and ranks[0].stats["train_rows"] == 12


# ------------------------------------------------------------------------------------------------ keep_best
def _fake_checkpoint(root, step: int, fill: float) -> str:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "master.f32").write_bytes(bytes([int(fill)]) * 16)
    (path / "meta.json").write_text(json.dumps({"step": step}), encoding="utf-8")
    return str(path)


def test_the_best_checkpoint_is_kept_through_rotation_and_cleared_by_a_fresh_run(tmp_path):
    from slidedp.persist import checkpoint as ckpt

    root = tmp_path / "checkpoints"
    keeper = ckpt.BestKeeper(str(root), True)
    losses = {1: 3.0, 2: 2.0, 3: 2.5, 4: 2.0, 5: float("nan")}
    records = []
    for step, loss in losses.items():
        records.append({"step": step, "loss": 1.0, "eval_loss": loss})
        path = _fake_checkpoint(root, step, step)
        kept = keeper.written(step, path, records)
        assert (kept is not None) == (step in (1, 2)), step
        ckpt.prune(str(root), 1)
    best = root / "best"
    assert (best / "master.f32").read_bytes() == bytes([2]) * 16  # step 2's files, its directory long rotated away
    assert json.loads((best / "best.json").read_text()) == {"step": 2, "eval_loss": 2.0}
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(str(root))] == []  # fakes are not complete
    assert ckpt.best_eval_loss(str(root)) == 2.0 and ckpt.BestKeeper(str(root), True).best == 2.0  # resume
    assert ckpt.BestKeeper(str(root), False).written(6, _fake_checkpoint(root, 6, 6), [
        {"step": 6, "eval_loss": 0.5}]) is None
    assert str(best) in ckpt.clear(str(root)) and not best.exists()


# ------------------------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    return {
        "model": make_model_dir(str(root / "model"), "tiny-qwen3"),
        "train": make_token_data(str(root / "train.jsonl"), rows=2 * MBS * 4, seq_len=SEQ, seed=1),
        "held": make_token_data(str(root / "held.jsonl"), rows=EVAL_ROWS, seq_len=SEQ, seed=2),
        "root": root,
        "runs": {},
    }


RUNS = {
    # both delivery routes and both gradient routes; the second updates the embedding, head and first layer on
    # the device (their weights live in the window's kept buffers) in a window of two buffers
    "replicated-host": {"delivery": "replicated", "grad_reduce": "host", "edge_update": "host", "device_layers": 0,
                        "resident_units": 1},
    "sharded-device": {"delivery": "sharded", "grad_reduce": "gpu", "edge_update": "gpu", "device_layers": 1,
                       "window": 2},
}


def _run(workdir, name: str, evaluate: bool = True, steps: int = 2, **extra) -> dict:
    key = (name, evaluate, steps, json.dumps(extra, sort_keys=True))
    if key in workdir["runs"]:
        return workdir["runs"][key]
    out = str(workdir["root"] / f"run-{len(workdir['runs'])}")
    cfg = {
        "model": workdir["model"],
        "data": {"path": workdir["train"], "format": "tokens", "shuffle": False},
        "seq_len": SEQ, "micro_batch_size": MBS, "steps": steps, "ranks": 2, "precision": "fp32",
        "output_dir": out, "export": True, "cpu_threads": 1,
        "optimizer": {"lr": 3e-3, "eps": 1e-6},
        "policy": {"activations": "checkpoint", **RUNS[name]},
        "checkpoint": {"interval": steps, "keep": 1},
        **extra,
    }
    if evaluate:
        cfg["eval"] = {"path": workdir["held"], "interval": 1, "max_batches": 2, **extra.get("eval", {})}
    result = slidedp.train(cfg)
    assert result.status == "completed" and result.steps_done == steps
    workdir["runs"][key] = {"result": result, "out": out, "config": cfg}
    return workdir["runs"][key]


def _reference_loss(model_dir: str, data_path: str, rows: int | None = None) -> tuple[float, int]:
    """(mean token cross-entropy, targets) of a transformers model over the first `rows` rows, one forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids, labels = read_rows(data_path)
    ids, labels = ids[:rows], labels[:rows]
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    targets = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets,
                                             ignore_index=-100, reduction="sum")
    n = int((targets != -100).sum())
    return float(loss) / n, n


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_eval_loss_equals_a_plain_torch_forward(workdir, name):
    """Before the first step the model is the model directory's; after the last it is the exported one."""
    run = _run(workdir, name)
    records = run["result"].metrics
    assert [r["step"] for r in records] == [1, 2]
    start, n = _reference_loss(workdir["model"], workdir["held"])
    assert abs(records[0]["eval_loss_start"] - start) <= 1e-5 * start, (records[0]["eval_loss_start"], start)
    assert records[0]["eval_ppl_start"] == pytest.approx(math.exp(start), rel=1e-5)
    end, _ = _reference_loss(os.path.join(run["out"], "final"), workdir["held"])
    last = records[-1]
    assert abs(last["eval_loss"] - end) <= 1e-5 * end, (last["eval_loss"], end)
    assert last["eval_ppl"] == pytest.approx(math.exp(last["eval_loss"]))
    assert end != start  # the evaluation after the steps sees the trained weights
    for r in records:
        assert r["eval_tokens"] == n and r["eval_s"] > 0
    assert read_metrics(run["out"])[0]["eval_loss_start"] == records[0]["eval_loss_start"]


@pytest.mark.slow
def test_evaluation_does_not_change_training(workdir):
    """The same run with and without evaluation after every step: the same losses, norms and trained state, to
    the bit (the evaluation sends no gradient and leaves the updater, AdamW moments and step count alone)."""
    on, off = _run(workdir, "sharded-device"), _run(workdir, "sharded-device", evaluate=False)
    for a, b in zip(on["result"].metrics, off["result"].metrics):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
        assert "eval_loss" in a and not any(k.startswith("eval") for k in b)
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        files = [os.path.join(r["out"], "checkpoints", "step-00000002", f"{kind}.f32") for r in (on, off)]
        with open(files[0], "rb") as fa, open(files[1], "rb") as fb:
            assert fa.read() == fb.read(), kind


def _keep_best_run(workdir) -> dict:
    pattern = make_pattern_data(str(workdir["root"] / "pattern.jsonl"), rows=40, seq_len=SEQ, seed=5)
    # at this learning rate the eval loss falls unevenly over the 4 steps: the lowest is not the last step's
    return _run(workdir, "replicated-host", evaluate=False, steps=4,
                data={"path": pattern, "format": "tokens", "shuffle": True, "seed": 1},
                optimizer={"lr": 0.05, "eps": 1e-6},
                eval={"holdout": 0.25, "interval": 1, "max_batches": 2, "keep_best": True},
                checkpoint={"interval": 1, "keep": 1})


@pytest.mark.slow
def test_keep_best_keeps_the_checkpoint_with_the_lowest_eval_loss(workdir):
    """Held-out rows, evaluated and checkpointed after every step, one checkpoint kept: best/ is the checkpoint of
    the lowest eval loss, kept after rotation, and its weights give that loss again."""
    from slidedp.data import DataPipeline
    from slidedp.persist.export import export_checkpoint

    steps = 4
    run = _keep_best_run(workdir)
    records = run["result"].metrics
    losses = {r["step"]: r["eval_loss"] for r in records}
    assert sorted(losses) == list(range(1, steps + 1))
    best_step = min(losses, key=lambda s: (losses[s], s))
    assert best_step < steps, losses  # so its own checkpoint directory was rotated away (keep 1)
    best = os.path.join(run["out"], "checkpoints", "best")
    meta = json.load(open(os.path.join(best, "best.json"), encoding="utf-8"))
    assert meta == {"step": best_step, "eval_loss": losses[best_step]}
    assert sorted(os.listdir(os.path.join(run["out"], "checkpoints"))) == ["best", f"step-{steps:08d}"]
    # its weights, exported, evaluate to the recorded loss over the held-out rows the ranks evaluated
    export_checkpoint(best, str(workdir["root"] / "best-export"))
    cfg = JobConfig.from_dict(run["config"])
    with DataPipeline(cfg, None, 0, 1) as pipe:
        held = pipe.eval_rows
        assert pipe.stats["eval_rows"] == 10 and pipe.stats["train_rows"] == 30
    rows = held.input_ids[: 2 * MBS * 2]
    path = workdir["root"] / "held-rows.jsonl"
    path.write_text("".join(json.dumps({"input_ids": r.tolist()}) + "\n" for r in rows), encoding="utf-8")
    again, _ = _reference_loss(str(workdir["root"] / "best-export"), str(path))
    assert abs(again - losses[best_step]) <= 1e-5 * again, (again, losses[best_step])


@pytest.mark.slow
def test_a_resumed_run_evaluates_before_its_first_step_and_keeps_the_best_going(workdir):
    """Resuming the keep_best run (a copy of its folder) for two more steps: the evaluation before the resumed
    run's first step sees the checkpoint's weights (the earlier run's last eval loss, to the bit), the held-out
    split and the data stream continue, and best/ moves only for a lower eval loss than the kept one."""
    import shutil

    first = _keep_best_run(workdir)
    out = str(workdir["root"] / "resumed")
    shutil.copytree(first["out"], out)
    cfg = {**first["config"], "output_dir": out, "steps": 6, "resume": True}
    result = slidedp.train(cfg)
    assert result.status == "completed" and [r["step"] for r in result.metrics] == [5, 6]
    before = {r["step"]: r["eval_loss"] for r in first["result"].metrics}
    assert result.metrics[0]["eval_loss_start"] == before[4]
    kept = min(before.values())
    meta = json.load(open(os.path.join(out, "checkpoints", "best", "best.json"), encoding="utf-8"))
    after = {r["step"]: r["eval_loss"] for r in result.metrics}
    lowest = min(after.values())
    if lowest < kept:
        assert meta == {"step": min(after, key=after.get), "eval_loss": lowest}
    else:
        assert meta["eval_loss"] == kept
