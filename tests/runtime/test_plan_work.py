"""Planning's work does not grow with grad_accum: a step of many micro-batches is replayed at two short lengths
and extended along their difference (planning/long_step.py, steady_samples), and the window's deliveries in the
bound are counted the same way. The work is counted (replayed tasks, schedule items the window walks), not
timed; the predictions equal what the full replay gives."""

import dataclasses
import json
import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import bound as bound_module
from slidedp.planning import cost_model as cm
from slidedp.planning import long_step, overlap, program
from slidedp.policy import ExecutionPolicy

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _gpu_job(grad_accum: int, **raw) -> JobConfig:
    return JobConfig.from_dict(
        {"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8, "seq_len": 2048,
         "grad_accum": grad_accum, **raw}
    )


@pytest.fixture(scope="module")
def pcie_host():
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        topo = json.load(fh)["pcie_host"]
    with open(os.path.join(FIX, "h200x2_calibration.json")) as fh:
        cal = json.load(fh)["qwen3-8b_bs8_pcie_host"]
    return topo, cal


@pytest.fixture(scope="module")
def cpu_demo():
    """The CPU demo job (slidedp/assets/demo/job.yaml) and a quick calibration of it measured here."""
    import slidedp
    import yaml
    from slidedp.planning.calibration import calibrate

    with open(os.path.join(os.path.dirname(slidedp.__file__), "assets", "demo", "job.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw.pop("output_dir")
    topo = {"schema": 1, "hostname": "test", "gpus": [], "links": [], "cpu": {"logical_cores": 2, "cores": 2},
            "host_ram": {"limit_bytes": 8 * 2**30, "source": "test"}}
    return raw, topo, calibrate(JobConfig.from_dict(raw), topo, quick=True)


def _counted_plan(monkeypatch, cfg, topo, cal) -> tuple[dict, dict[str, int]]:
    """The plan (with the card sweep, as the web preview asks) and the work it took: tasks the overlap model
    placed and schedule items the window walked."""
    work = {"tasks": 0, "window_items": 0}
    real_new, real_window = program.Program._new, bound_module.window_plan

    def new(self, *args, **kw):
        work["tasks"] += 1
        return real_new(self, *args, **kw)

    def window(schedule, *args):
        work["window_items"] += len(schedule)
        return real_window(schedule, *args)

    monkeypatch.setattr(program.Program, "_new", new)
    monkeypatch.setattr(program, "window_plan", window)
    monkeypatch.setattr(bound_module, "window_plan", window)
    plan = ap.plan_job(cfg, topo, cal, sweep=True)
    monkeypatch.undo()
    return plan, work


def test_planning_the_cpu_demo_with_65536_micro_batches_does_the_work_of_a_short_step(monkeypatch, cpu_demo):
    raw, topo, cal = cpu_demo
    plans, work = {}, {}
    for m in (8, 1024, 65536):
        plans[m], work[m] = _counted_plan(monkeypatch, JobConfig.from_dict({**raw, "grad_accum": m}), topo, cal)
        assert plans[m]["feasible"] and plans[m]["predicted"]["step_time_s"] > 0
    assert work[8]["tasks"] > 1000 and work[8]["window_items"] > 0  # the count sees the replay
    assert work[65536] == work[1024]  # past the exact range the work no longer depends on grad_accum
    assert work[65536]["tasks"] < 3 * work[8]["tasks"]
    assert work[65536]["window_items"] < 3 * work[8]["window_items"]
    # the time of a step grows with its micro-batches, as the work does not
    per_micro_batch = plans[8]["predicted"]["step_time_s"] / 8
    assert plans[65536]["predicted"]["step_time_s"] == pytest.approx(65536 * per_micro_batch, rel=0.2)


@pytest.fixture(scope="module")
def gpu_policies(pcie_host):
    """The plans' chosen policies on the two-H200 machine without P2P, with and without exact clipping."""
    topo, cal = pcie_host
    out = []
    for raw in ({}, {"optimizer": {"max_grad_norm": 1.0}}):
        cfg = _gpu_job(1, **raw)
        plan = ap.plan_job(cfg, topo, cal)
        assert plan["feasible"]
        job = cm.Job.from_config(cfg, topo)
        out.append((job, ExecutionPolicy.from_dict(plan["policy"], world=job.world), cm.Rates(cal, job)))
    return out


def _full(job, pol, rates, m: int) -> overlap.Outcome:
    return overlap.replay(cm.durations(dataclasses.replace(job, grad_accum=m), pol, rates))


@pytest.mark.slow
def test_a_long_steps_prediction_is_the_linear_extension_of_full_replays(cpu_demo, gpu_policies):
    """A long step predicts what full replays of short steps extend to: per two micro-batches the step takes
    what the full replays at 14 and 16 (15 and 17 for an odd step) differ by, from the one at 16."""
    raw, topo, cal = cpu_demo
    cfg = JobConfig.from_dict({**raw, "grad_accum": 65536})
    plan = ap.plan_job(cfg, topo, cal)
    job = cm.Job.from_config(cfg, topo)
    cases = [(plan["predicted"]["step_time_s"], job, ExecutionPolicy.from_dict(plan["policy"], world=job.world),
              cm.Rates(cal, job))]
    for m, (job, pol, rates) in zip((65536, 4001), gpu_policies):
        job = dataclasses.replace(job, grad_accum=m)
        cases.append((cm.predict(job, pol, rates)["step_time_s"], job, pol, rates))
    for predicted, job, pol, rates in cases:
        m = job.grad_accum
        lo, hi = _full(job, pol, rates, 14 + m % 2), _full(job, pol, rates, 16 + m % 2)
        expected = hi.step_time_s + (m - 16 - m % 2) / 2 * (hi.step_time_s - lo.step_time_s)
        assert predicted == pytest.approx(expected, rel=1e-9)
        assert predicted > 0.5 * m / 16 * hi.step_time_s  # a long step's time, not a short one's


def test_past_the_exact_range_the_plan_matches_the_full_replay(monkeypatch, cpu_demo, gpu_policies):
    """Just past EXACT_MICRO_BATCHES the extended prediction equals the one made by replaying every
    micro-batch: the CPU demo's whole plan (same policy, step time, phases, spans), and on the GPUs the
    prediction with every exposure and the bound, to rounding."""
    raw, topo, cal = cpu_demo
    m = long_step.EXACT_MICRO_BATCHES + 1
    cfg = JobConfig.from_dict({**raw, "grad_accum": m})
    gpu = [(dataclasses.replace(job, grad_accum=m), pol, rates) for job, pol, rates in gpu_policies]

    def predictions() -> list[dict]:
        plan = ap.plan_job(cfg, topo, cal)
        out = [{**plan["predicted"], "policy": plan["policy"]}]
        for job, pol, rates in gpu:
            out.append({**cm.predict(job, pol, rates, exposure=True), "bound": bound_module.bound(job, pol, rates)})
        return out

    assert long_step.steady_samples(m) is not None
    extended = predictions()
    monkeypatch.setattr(long_step, "EXACT_MICRO_BATCHES", 10**9)
    assert long_step.steady_samples(m) is None
    full = predictions()
    assert extended[0]["policy"] == full[0]["policy"]
    for a, b in zip(extended, full):
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-9)
        for key in ("phases", "spans", "exposed"):
            assert a[key].keys() == b[key].keys()
            for k in a[key]:
                assert a[key][k] == pytest.approx(b[key][k], rel=1e-9, abs=1e-12), (key, k)
    for a, b in zip(extended[1:], full[1:]):
        assert a["bound"]["terms_s"] == pytest.approx(b["bound"]["terms_s"], rel=1e-12)
        assert a["bound"]["host_dram_bytes"] == pytest.approx(b["bound"]["host_dram_bytes"], rel=1e-12)
