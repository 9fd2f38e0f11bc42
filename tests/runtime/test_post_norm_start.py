"""cost_model.POST_NORM_START_S: with clipping, the first host unit updated after the norm ends later than its
charged update; the step timelines kept under docs/results measure by how much, and the replay charges the median
to the updater before its first post-norm unit (a GPU job's clipped step only)."""

from __future__ import annotations

import json
import os
import statistics

import pytest
from slidedp.config import JobConfig
from slidedp.planning import cost_model as cm
from slidedp.planning import overlap
from slidedp.planning.job import Job
from slidedp.policy import ExecutionPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")

# Every clipped step timeline kept of an engine that landed (s27/t/new-1.jsonl ran a post-norm thread count that was
# measured and reverted, so it is not among them): the H200 machine (s21) and four H100 hosts (s22-s28).
CLIPPED_TIMELINES = [
    "s21/pair4-trace/trace-rank0-2.jsonl",
    "s21/comp8-trace/trace-rank0-2.jsonl",
    "s22/passes4-trace/trace-rank0-2.jsonl",
    "s22/passes4-trace/trace-rank0-3.jsonl",
    "s23/pair4-trace/trace-rank0-2.jsonl",
    "s25/pair4-trace/trace-rank0-2.jsonl",
    "s27/t/base-1.jsonl",
    "s27/t/base-2.jsonl",
    "s28/pair8-trace/trace-rank0-2.jsonl",
]


def first_unit_excess(path: str, first_step: int = 3) -> float:
    """The median over a timeline's steps (from first_step on) of: the end of the step's first post-norm unit after
    the backward's end on the GPU, less the median time of the step's other post-norm units (each step's own
    charge for one unit's update)."""
    with open(os.path.join(RESULTS, path), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    gpu = {r["step"]: r for r in rows if r["kind"] == "gpu"}
    out = []
    for s, g in sorted(gpu.items()):
        finals = sorted((r for r in rows if r["kind"] == "final" and r["step"] == s), key=lambda r: r["t0"])
        if s < first_step or len(finals) < 2 or "backward_end" not in g:
            continue
        rest = statistics.median(r["t1"] - r["t0"] for r in finals[1:])
        out.append(finals[0]["t1"] - g["backward_end"] - rest)
    assert out, f"{path}: no clipped step with post-norm units"
    return statistics.median(out)


def test_the_start_is_the_median_of_the_kept_clipped_timelines():
    excess = [first_unit_excess(t) for t in CLIPPED_TIMELINES]
    assert all(0.0 < e < 0.1 for e in excess), excess  # later in every timeline, never by a unit's whole phase
    assert cm.POST_NORM_START_S == pytest.approx(statistics.median(excess), abs=0.005)


def _durations(clip: float, gpus: int = 1) -> overlap.Durations:
    with open(os.path.join(RESULTS, "s25", "calibration", "vm-68b061e8b1b7faf5.json")) as fh:
        cal = json.load(fh)
    with open(os.path.join(RESULTS, "s25", "topology.json")) as fh:
        topo = json.load(fh)
    if not gpus:
        cal = dict(cal, device="cpu")
    cfg = JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": gpus, "micro_batch_size": 4,
                               "seq_len": 2048, "optimizer": {"max_grad_norm": clip}})
    job = Job.from_config(cfg, topo)
    pol = ExecutionPolicy.default(job.layers)
    return cm.durations(job, pol, cm.Rates(cal, job))


def test_only_a_gpu_jobs_clipped_step_is_charged_the_start():
    assert _durations(1.0).post_norm_start == cm.POST_NORM_START_S
    assert _durations(0.0).post_norm_start == 0.0  # no norm to wait for: the updates run during the backward
    assert _durations(1.0, gpus=0).post_norm_start == 0.0  # not measured on CPU ranks


def test_the_replay_puts_it_before_the_first_post_norm_unit_and_the_step_pays_it():
    from dataclasses import replace

    d = _durations(1.0)
    with_start = overlap.replay(d)
    without = overlap.replay(replace(d, post_norm_start=0.0))
    # every unit updated on the host after the norm binds this clipped step: the start moves it by up to its length
    assert 0.0 < with_start.step_time_s - without.step_time_s <= cm.POST_NORM_START_S + 1e-9
    # and it is the host update's: made free with the rest of it, it costs nothing
    free = overlap.replay(replace(d, zero=overlap.EXPOSURE_KINDS["cpu_update"]))
    free_without = overlap.replay(replace(d, post_norm_start=0.0, zero=overlap.EXPOSURE_KINDS["cpu_update"]))
    assert free.step_time_s == pytest.approx(free_without.step_time_s)
