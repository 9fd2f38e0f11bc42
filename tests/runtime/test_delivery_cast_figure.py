"""The delivery cast beside the compute in the step model: calibration's `delivery_cast` figure (a decoder layer's
delivery with the cast on the GPU, alone and beside the layer's forward; slidedp.planning.microbench.delivery_cast,
timed on a GPU by tests/gpu/test_gpu_delivery_cast_figure.py) slows the deliveries the compute runs beside, picks
the figure of the policy's cast, and lets AutoPolicy take the cast scratch (policy.cast_scratch_mb) where it pays.

The defect: the model charged a cast delivery the link's rate, so a Qwen3-8B step at micro-batch 8 with the cast on
the GPU was predicted 7-8.5% short on an H100 machine (docs/results/s36), and AutoPolicy never took the scratch that
measured 5.6-7% faster there."""

import copy
import dataclasses

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning.cost_model import Rates
from slidedp.planning.job import Job
from slidedp.policy import ExecutionPolicy

CAL = "calibration_qwen3-4b_bs4"


def _figure(cal: dict, k_default: float, k_ring: float, per_chunk: dict | None = None) -> dict:
    """A calibration with a `delivery_cast` figure: deliveries alone at the link's rate of 64 MiB chunks, beside
    the compute k times that."""
    c = copy.deepcopy(cal)
    n = 100_000_000
    t = c["transfers"]
    alone = 4 * n / (t["h2d_GBps"][t["chunk_mib"].index(64)] * 1e9)

    def fig(k: float) -> dict:
        return {"alone_s": alone, "beside_s": alone * k, "forwards": 3}

    per_chunk = per_chunk or {}
    c["delivery_cast"] = {"params": n, "bytes": 4 * n, "forward_s": 0.01, "chunk_mib": [16, 64, 256],
                          "default": [fig(per_chunk.get(m, k_default)) for m in (16, 64, 256)],
                          "ring_mib": 256, "ring_chunk_mib": 64, "ring": fig(k_ring)}
    return c


def _cfg(policy: dict, **over) -> JobConfig:
    cfg = {"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4, "seq_len": 2048,
           "cpu_threads": 16, "optimizer": {"max_grad_norm": 0.0}, "policy": policy}
    cfg.update(over)
    return JobConfig.from_dict(cfg)


FIXED = {"delivery_cast": "gpu", "activations": "checkpoint", "resident_units": 0, "device_layers": 0,
         "edge_update": "host", "window": 3, "chunk_mb": 64, "loss_chunk_tokens": 2048, "streamed_layers": 0,
         "cast_scratch_mb": 0}


def _plan(topo: dict, cal: dict, policy: dict, **over) -> dict:
    plan = ap.plan_job(_cfg(policy, **over), topo, cal)
    assert plan["feasible"], plan["errors"]
    return plan


def test_a_cast_delivery_beside_the_compute_is_charged_the_calibrated_slowdown(one_h200):
    topo, cals = one_h200
    cal = cals[CAL]
    before = _plan(topo, cal, FIXED)["predicted"]
    same = _plan(topo, _figure(cal, 1.0, 1.0), FIXED)["predicted"]
    slow = _plan(topo, _figure(cal, 1.6, 1.0), FIXED)["predicted"]
    # a figure that says "as fast as alone" changes nothing; one that says 1.6x lengthens the forward, whose
    # checkpointed layers run beside their deliveries
    assert same["step_time_s"] == pytest.approx(before["step_time_s"], rel=1e-9)
    assert slow["spans"]["forward"] > before["spans"]["forward"] * 1.05
    assert slow["step_time_s"] > before["step_time_s"]
    # the host cast delivers bf16 with no kernel on the GPU: the figure is not its
    host = {**FIXED, "delivery_cast": "host"}
    assert _plan(topo, _figure(cal, 1.6, 1.0), host)["predicted"]["step_time_s"] == pytest.approx(
        _plan(topo, cal, host)["predicted"]["step_time_s"], rel=1e-9)


def test_the_figure_is_the_one_of_the_policys_cast(one_h200):
    topo, cals = one_h200
    cal = _figure(cals[CAL], 1.5, 1.05, per_chunk={16: 1.8, 256: 1.3})
    job = Job.from_config(_cfg(FIXED), topo)
    rates = Rates(cal, job)
    pol = ExecutionPolicy.default(job.layers, delivery_cast="gpu", chunk_mb=64)
    k = lambda **kw: rates.cast_beside_compute(dataclasses.replace(pol, **kw))  # noqa: E731
    assert k() == pytest.approx(1.5)
    assert k(chunk_mb=16) == pytest.approx(1.8) and k(chunk_mb=256) == pytest.approx(1.3)
    assert k(cast_scratch_mb=256) == pytest.approx(1.05)
    assert k(cast_scratch_mb=512) == pytest.approx(1.05)
    # the ring measured at 64 MiB chunks: at 256 MiB its buffers are two halves of a chunk, not what was measured,
    # and a smaller scratch than measured is charged as the default cast
    assert k(cast_scratch_mb=256, chunk_mb=256) == pytest.approx(1.3)
    assert k(cast_scratch_mb=128) == pytest.approx(1.5)
    assert k(delivery_cast="host") == 1.0
    assert Rates(cals[CAL], job).cast_beside_compute(pol) == 1.0  # calibrated before the figure: as before
    fp32 = Job.from_config(_cfg(FIXED, precision="fp32"), topo)
    assert Rates(dict(cal, shape=dict(cal["shape"], precision="fp32")), fp32).cast_figure(pol) is None


def test_autopolicy_takes_the_cast_scratch_only_where_it_pays_and_fits(one_h200):
    topo, cals = one_h200
    free = {k: v for k, v in FIXED.items() if k not in ("window", "cast_scratch_mb")}
    # the default cast slowed beside the compute, the ring not: the scratch is taken and counted
    plan = _plan(topo, _figure(cals[CAL], 1.6, 1.02), free, gpu_memory_gib=40.0)
    assert plan["policy"]["cast_scratch_mb"] == 256
    assert plan["predicted"]["hbm_parts_gib"]["cast_scratch"] > 0.25
    # the same figures at both: the scratch buys nothing and is not taken; nor without a figure (as before)
    assert _plan(topo, _figure(cals[CAL], 1.3, 1.3), free, gpu_memory_gib=40.0)["policy"]["cast_scratch_mb"] == 0
    assert _plan(topo, cals[CAL], free, gpu_memory_gib=40.0)["policy"]["cast_scratch_mb"] == 0
    # the job's own value is kept, and the host cast never gets one
    assert _plan(topo, _figure(cals[CAL], 1.6, 1.02), {**free, "cast_scratch_mb": 0},
                 gpu_memory_gib=40.0)["policy"]["cast_scratch_mb"] == 0
    assert _plan(topo, _figure(cals[CAL], 1.6, 1.02), {**free, "delivery_cast": "host"},
                 gpu_memory_gib=40.0)["policy"]["cast_scratch_mb"] == 0


def test_a_scratch_the_later_knobs_leave_unpaid_is_given_back(one_h200):
    """As calibrated on an H100 host (docs/results/s37): the default cast slowed beside the compute at 64 MiB
    chunks, hardly at 256 MiB, the ring hardly at 64. The sweep takes the scratch at 64 MiB and the chunk sweep then
    moves to 256 MiB, where the scratch buys nothing and its buffers are not the ring measured: it is given back."""
    topo, cals = one_h200
    cal = _figure(cals[CAL], 1.31, 1.07, per_chunk={16: 2.07, 256: 1.0})
    free = {k: v for k, v in FIXED.items() if k not in ("window", "chunk_mb", "cast_scratch_mb")}
    plan = _plan(topo, cal, free, gpu_memory_gib=40.0)
    pol = plan["policy"]
    if pol["cast_scratch_mb"]:
        assert pol["chunk_mb"] == 64, pol
        assert plan["cast_scratch"]["step_time_s"] < plan["cast_scratch"]["without_s"] * 0.999
    # where the ring's chunk is the one that pays, the scratch stays
    assert _plan(topo, _figure(cals[CAL], 1.6, 1.02, per_chunk={16: 2.0, 256: 1.6}), free,
                 gpu_memory_gib=40.0)["policy"]["cast_scratch_mb"] == 256


def test_a_plan_with_the_scratch_stays_within_a_tight_cap(one_h200):
    """Under a cap the scratch's 256 MiB come out of the plan's other memory (a window buffer, kept activations),
    and the plan that results must fit, or the scratch is not taken."""
    topo, cals = one_h200
    cal = _figure(cals[CAL], 1.6, 1.02)
    took = []
    for cap in (14.0, 16.0, 20.0):
        plan = ap.plan_job(_cfg({"delivery_cast": "gpu"}, gpu_memory_gib=cap), topo, cal)
        assert plan["feasible"], (cap, plan["errors"])
        assert plan["predicted"]["hbm_peak_gib"] <= plan["job"]["hbm_budget_gib"] + 1e-9, cap
        took.append(plan["policy"]["cast_scratch_mb"])
    assert 256 in took


def test_a_figure_that_could_not_be_measured_charges_the_link(one_h200):
    """Calibration records why the figure failed (calibration.measured_cast) and the job still plans, as before it."""
    topo, cals = one_h200
    cal = dict(cals[CAL], delivery_cast={"error": "OutOfMemoryError: CUDA out of memory"})
    job = Job.from_config(_cfg(FIXED), topo)
    pol = ExecutionPolicy.default(job.layers, delivery_cast="gpu")
    assert Rates(cal, job).cast_figure(pol) is None
    assert _plan(topo, cal, {k: v for k, v in FIXED.items() if k != "cast_scratch_mb"})["policy"]["cast_scratch_mb"] == 0


def test_calibration_keeps_a_failed_figure_as_its_reason():
    from slidedp.planning import calibration

    class Parts:
        def layer_calls(self, mb, seq):
            raise RuntimeError("CUDA error: out of memory\nmore")

    rec = calibration.measured_cast(Parts(), _cfg(FIXED), None)
    assert rec == {"error": "RuntimeError: CUDA error: out of memory"}


def test_the_plan_says_what_the_scratch_buys(one_h200):
    from slidedp.planning.plan import Plan
    from slidedp.planning.report import format_plan

    topo, cals = one_h200
    free = {k: v for k, v in FIXED.items() if k not in ("window", "cast_scratch_mb")}
    plan = _plan(topo, _figure(cals[CAL], 1.6, 1.02), free, gpu_memory_gib=40.0)
    choice = plan["cast_scratch"]
    assert choice["mb"] == 256 and not choice["fixed"]
    assert choice["step_time_s"] == pytest.approx(plan["predicted"]["step_time_s"])
    assert choice["without_s"] > choice["step_time_s"]
    text = format_plan(Plan.from_dict(plan))
    assert "cast scratch: 256 MiB on each GPU (taken by the planner)" in text and "s saved" in text
    # set by the job, said so; none, nothing said
    fixed = _plan(topo, _figure(cals[CAL], 1.6, 1.02), {**free, "cast_scratch_mb": 256}, gpu_memory_gib=40.0)
    assert fixed["cast_scratch"]["fixed"] is True
    plain = _plan(topo, cals[CAL], free, gpu_memory_gib=40.0)
    assert "cast_scratch" not in plain and "cast scratch" not in format_plan(Plan.from_dict(plain))


def test_any_failure_of_the_figure_leaves_the_calibration_standing():
    from slidedp.planning import calibration

    class Parts:
        def layer_calls(self, mb, seq):
            raise TypeError("unexpected keyword")

    assert calibration.measured_cast(Parts(), _cfg(FIXED), None) == {"error": "TypeError: unexpected keyword"}


def test_the_slowdown_follows_the_share_of_a_delivery_the_compute_runs():
    """overlap._beside_compute: a delivery wholly beside the compute k times, half beside it 1 + (k - 1) / 2, one
    before it or after it not at all, on top of a pool's factor."""
    from slidedp.planning.overlap import _beside_compute
    from slidedp.planning.program import Task

    def task(kind: str, res: str, a: float, b: float, order: int) -> Task:
        t = Task(kind, res, b - a, [])
        t.start, t.end, t.order = a, b, order
        return t

    compute = [task("compute", "compute", 1.0, 2.0, 0), task("compute", "compute", 2.0, 3.0, 1),
               task("compute", "compute", 4.0, 5.0, 2)]
    casts = [task("deliver", "h2d", 1.5, 2.5, 10), task("deliver", "h2d", 3.0, 4.0, 11),
             task("deliver", "h2d", 2.5, 4.5, 12), task("deliver", "h2d", 0.0, 0.5, 13),
             task("deliver", "h2d", 5.0, 6.0, 14)]
    factors = {12: 1.5}
    _beside_compute(casts, compute, 1.8, factors)
    assert factors[10] == pytest.approx(1.8)
    assert 11 not in factors and 13 not in factors and 14 not in factors
    assert factors[12] == pytest.approx(1.5 * (1 + 0.8 * 0.5))  # 2.5-3.0 and 4.0-4.5 of 2.5-4.5
    _beside_compute(casts, [], 1.8, factors)  # no compute: nothing changes
    assert factors[10] == pytest.approx(1.8)
