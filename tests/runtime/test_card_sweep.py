"""The card sweep on the nvidia-h200-x2 machine's figures (tests/runtime/fixtures/h200x2_*.json, the planner tests'
fixtures): for 16, 24, 48, 80 GiB per GPU and the whole card, the plan says what AutoPolicy would choose and
predict. More memory never predicts a slower step, a size that cannot hold the job says why and names the
smallest that can, the job's own row is the plan itself, and a row is what the job gets when it sets that
gpu_memory_gib."""

import json
import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning.card_sweep import SIZES_GIB, policy_words
from slidedp.planning.job import GIB, HBM_BUDGET_FRACTION, cap_budget

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
CARD_GIB = 150754820096 / GIB  # the fixture's H200


def _cfg(**raw):
    base = {"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8, "seq_len": 2048,
            "optimizer": {"max_grad_norm": 0.0}}  # the figures below are of unclipped jobs
    base.update(raw)
    return JobConfig.from_dict(base)


@pytest.fixture(scope="module")
def swept(x2):
    """Qwen3-8B at micro-batch 8 on the NVLink pair, planned with its card sweep."""
    topo, cal = x2
    return ap.plan_job(_cfg(), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"], sweep=True)


def _budget_gib(row: dict) -> float:
    if row["whole_card"]:
        return CARD_GIB * HBM_BUDGET_FRACTION
    return min(CARD_GIB * HBM_BUDGET_FRACTION, cap_budget(int(row["hbm_gib"] * GIB)) / GIB)


def test_every_size_below_the_card_and_the_whole_card_are_swept(swept):
    rows = swept["card_sweep"]
    assert [r["hbm_gib"] for r in rows] == [*SIZES_GIB, pytest.approx(CARD_GIB)]
    assert [r["whole_card"] for r in rows] == [False] * len(SIZES_GIB) + [True]
    assert set(rows[0]) == {"hbm_gib", "fits", "step_time_s", "tokens_per_s", "hbm_peak_gib", "policy", "why_not",
                            "current", "whole_card"}
    assert json.loads(json.dumps(swept)) == swept


def test_step_time_never_rises_as_memory_grows(swept):
    rows = swept["card_sweep"]
    fitting = [r for r in rows if r["fits"]]
    # once a size holds the job, every larger one does
    assert [r["fits"] for r in rows] == [False] * (len(rows) - len(fitting)) + [True] * len(fitting)
    assert len(fitting) >= 3
    times = [r["step_time_s"] for r in fitting]
    assert all(t is not None and t > 0 for t in times)
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:])), times
    assert times[-1] < times[0]  # memory is worth something to this job: the whole card beats 48 GiB
    for r in fitting:
        assert r["hbm_peak_gib"] <= _budget_gib(r) + 1e-9, r
        assert r["tokens_per_s"] == pytest.approx(swept["job"]["tokens_per_step"] / r["step_time_s"])
        assert r["why_not"] is None and r["policy"]


def test_a_size_that_cannot_hold_the_job_says_why_and_names_the_smallest_that_can(swept):
    rows = swept["card_sweep"]
    refused = [r for r in rows if not r["fits"]]
    # 24 GiB holds it with gradients reduced on the host (no reduce-scatter shard on the GPU): sharded/host
    assert [r["hbm_gib"] for r in refused] == [16]
    first_fit = min(r["hbm_gib"] for r in rows if r["fits"])
    for r in refused:
        assert r["step_time_s"] is None and r["tokens_per_s"] is None and r["policy"] is None
        assert f"{r['hbm_gib']:g} GiB is too small for this job" in r["why_not"]
        smallest = float(r["why_not"].split("smallest gpu_memory_gib that fits is ")[1].split(" GiB")[0])
        assert r["hbm_gib"] < smallest <= first_fit


def test_the_whole_card_row_is_the_plans_own_prediction(swept):
    whole = swept["card_sweep"][-1]
    assert whole["current"] and sum(r["current"] for r in swept["card_sweep"]) == 1
    assert whole["hbm_gib"] == swept["job"]["hbm_card_gib"]
    assert whole["step_time_s"] == swept["predicted"]["step_time_s"]
    assert whole["tokens_per_s"] == swept["predicted"]["tokens_per_s"]
    assert whole["hbm_peak_gib"] == swept["predicted"]["hbm_peak_gib"]
    assert whole["policy"] == policy_words(swept["policy"])
    assert swept["job"]["hbm_cap_gib"] is None


def test_a_row_is_the_plan_the_job_gets_with_that_gpu_memory_gib(swept, x2):
    """Setting gpu_memory_gib to a row's size plans what the row said, and the job summary shows the cap."""
    topo, cal = x2
    row = next(r for r in swept["card_sweep"] if r["hbm_gib"] == 80)
    capped = ap.plan_job(_cfg(gpu_memory_gib=80), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    assert capped["feasible"] and "card_sweep" not in capped  # only asked for by what a person reads
    assert capped["predicted"]["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-12)
    assert capped["predicted"]["hbm_peak_gib"] == pytest.approx(row["hbm_peak_gib"], rel=1e-12)
    assert policy_words(capped["policy"]) == row["policy"]
    assert capped["job"]["hbm_cap_gib"] == 80.0
    assert capped["job"]["hbm_budget_gib"] == pytest.approx(cap_budget(80 * GIB) / GIB)


def test_with_a_cap_its_row_is_the_plan_and_the_whole_card_is_planned_too(x2, monkeypatch):
    """Without times (memory only) the sweep is cheap: a cap of 40 GiB is the job's row, the whole card is
    planned without the cap, and a size whose budget holds the choice of the size above it takes that choice
    without a search."""
    topo, _ = x2
    searched = []
    real = ap._Planner.best_at
    monkeypatch.setattr(ap._Planner, "best_at", lambda self, job: searched.append(job.hbm_cap_bytes) or real(self, job))
    plan = ap.plan_job(_cfg(micro_batch_size=4, gpu_memory_gib=40), topo["nvlink"], None, sweep=True)
    rows = plan["card_sweep"]
    assert plan["feasible"] and plan["calibration"] == "missing"
    assert [r["hbm_gib"] for r in rows] == [16, 24, 40, 48, 80, pytest.approx(CARD_GIB)]
    assert [r["current"] for r in rows] == [False, False, True, False, False, False]
    assert all(r["step_time_s"] is None and r["tokens_per_s"] is None for r in rows)
    own = rows[2]
    assert own["hbm_peak_gib"] == plan["predicted"]["hbm_peak_gib"] and own["policy"] == policy_words(plan["policy"])
    peak = plan["predicted"]["hbm_peak_gib"]  # memory only: every layer checkpointed at every size
    for r in rows:
        assert r["fits"] == (peak <= _budget_gib(r)), r
    # searched: the whole card (no cap), then only the sizes the choice above them does not fit
    assert searched[0] is None
    assert all(cap_budget(s) / GIB < peak for s in searched[1:])
    assert len(searched) < len(rows) - 1
    assert plan["job"]["hbm_cap_gib"] == 40.0


def test_a_cpu_job_has_no_card_sweep(x2):
    topo, _ = x2
    plan = ap.plan_job(_cfg(model="tiny-qwen3", gpus=0, micro_batch_size=1, seq_len=64), topo["nvlink"], None,
                       sweep=True)
    assert plan["feasible"] and plan["card_sweep"] == []
    assert "GPU memory per GPU" not in ap.format_plan(plan)


def test_slidedp_plan_prints_the_sweep_with_the_jobs_row_marked(swept):
    text = ap.format_plan(swept)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GPU memory per GPU"))
    assert [c.strip() for c in lines[head].split("|")] == ["GPU memory per GPU", "step", "tokens/s", "fits", "policy"]
    table = lines[head + 1 : head + 1 + len(swept["card_sweep"])]
    marked = [line for line in table if line.startswith("* ")]
    assert len(marked) == 1 and "(whole card)" in marked[0]
    assert f"{swept['predicted']['step_time_s']:.3f} s" in marked[0]
    assert "| no   | 16 GiB is too small" in table[0]
    assert [line.split("|")[3].strip() for line in table] == ["yes" if r["fits"] else "no" for r in swept["card_sweep"]]


@pytest.mark.slow
def test_the_sweep_reuses_the_chosen_casts_search(x2, monkeypatch):
    """With the delivery cast left to AutoPolicy the job is searched once per cast; the card sweep runs on the
    chosen cast's planner (its predictions kept) instead of searching that cast a third time, and the plan is
    the one planned without the sweep, with the sweep added."""
    topo, cal = x2
    cfg = _cfg(policy={"delivery_cast": "auto"})
    plain = ap.plan_job(cfg, topo["nvlink"], cal["qwen3-8b_bs8_nvlink"])
    runs = []
    real_run = ap._Planner.run

    def counted(self):
        runs.append(self.cfg.policy.delivery_cast)
        return real_run(self)

    monkeypatch.setattr(ap._Planner, "run", counted)
    swept_plan = ap.plan_job(cfg, topo["nvlink"], cal["qwen3-8b_bs8_nvlink"], sweep=True)
    assert sorted(runs) == ["gpu", "host"]
    assert swept_plan["card_sweep"] and "card_sweep" not in plain
    assert {k: v for k, v in swept_plan.items() if k != "card_sweep"} == plain


def test_the_sweep_made_side_by_side_is_the_sweep_made_in_one_process(swept):
    """`slidedp plan` and the web preview plan inside forked.side_by_side(): in a fresh interpreter (a test process
    may hold threads, where nothing forks), both casts planned and swept in copies (the core count that asks for
    lowered to this machine's), every size's search in a copy of its own. The plan JSON, card sweep included, is
    the one-process plan's."""
    import subprocess
    import sys

    runtime = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "runtime")
    script = f"""
import json, os, sys
sys.path.insert(0, {runtime!r})
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap, forked
forked._load = lambda: 0.0  # the suite keeps this machine busy
ap.SWEPT_APART_MIN_CORES, ap.SIDE_BY_SIDE_MIN_S = 2, 0.0
forks, real_fork = [], os.fork
def counted_fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counted_fork
with open({os.path.join(FIX, "h200x2_topology.json")!r}) as fh:
    topo = json.load(fh)["nvlink"]
with open({os.path.join(FIX, "h200x2_calibration.json")!r}) as fh:
    cal = json.load(fh)["qwen3-8b_bs8_nvlink"]
cfg = JobConfig.from_dict({{"model": "qwen3-8b", "data": {{"path": "x.jsonl"}}, "gpus": 2, "micro_batch_size": 8,
                           "seq_len": 2048, "optimizer": {{"max_grad_norm": 0.0}}}})
with forked.side_by_side():
    plan = ap.plan_job(cfg, topo, cal, sweep=True)
print(json.dumps({{"forks": len(forks), "plan": plan}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert _cfg().to_dict() == JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2,
                                                    "micro_batch_size": 8, "seq_len": 2048,
                                                    "optimizer": {"max_grad_norm": 0.0}}).to_dict()
    assert out["forks"] >= 2  # the host cast's copy and this process's sizes (the host copy's are its own)
    assert len(out["plan"]["card_sweep"]) == 5 and out["plan"] == json.loads(json.dumps(swept))
