"""The typed plan (slidedp.planning.plan): a plan AutoPolicy makes on the planner fixtures of the two-H200 and
one-H200 machines (tests/runtime/fixtures) reads into Plan and writes back to the same JSON, key for key and in
the same order; a plan in an older shape loads and writes back as it was; what is not a plan is refused naming
the key at fault."""

import dataclasses
import json

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning.plan import Candidate, JobSummary, Plan, PlanError, Prediction


def _cfg(**raw):
    base = {"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 2, "micro_batch_size": 8, "seq_len": 2048}
    base.update(raw)
    return JobConfig.from_dict(base)


@pytest.fixture(scope="module")
def swept(x2):
    """Qwen3-8B at micro-batch 8 on the NVLink pair, timed, with its card sweep and headroom decision."""
    topo, cal = x2
    return ap.plan_job(_cfg(), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"], sweep=True)


def _refused(one_h200):
    """Qwen3-8B under a 24 GiB cap on the one-H200 machine: refused for memory."""
    topo, cals = one_h200
    cfg = JobConfig.from_dict({"model": "qwen3-8b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4,
                               "seq_len": 2048, "gpu_memory_gib": 24, "cpu_threads": 16,
                               "policy": {"delivery_cast": "gpu"}})
    return ap.plan_job(cfg, topo, cals["calibration_qwen3-8b_bs8"])


def _same_json(a: dict, b: dict) -> None:
    assert json.dumps(a) == json.dumps(b)  # the same keys, values and order


@pytest.mark.slow
def test_a_timed_plan_with_its_sweep_reads_and_writes_back_unchanged(swept):
    plan = Plan.from_dict(swept)
    _same_json(plan.to_dict(), swept)
    assert plan.feasible and plan.headroom is not None and plan.card_sweep
    assert isinstance(plan.predicted, Prediction) and isinstance(plan.job, JobSummary)
    assert all(isinstance(c, Candidate) for c in plan.candidates)
    assert plan.predicted.step_time_s == swept["predicted"]["step_time_s"]
    assert plan.predicted.bound == swept["predicted"]["bound"] and "bound" not in swept["candidates"][0]["predicted"]
    assert plan.job.hbm_budget_gib == swept["job"]["hbm_budget_gib"]


def test_plan_for_is_the_typed_plan_whose_json_plan_job_answers(x2, swept):
    topo, cal = x2
    typed = ap.plan_for(_cfg(), topo["nvlink"], cal["qwen3-8b_bs8_nvlink"], sweep=True)
    _same_json(typed.to_dict(), swept)
    assert typed == Plan.from_dict(swept)


def test_a_refusal_reads_and_writes_back_unchanged(one_h200):
    refused = _refused(one_h200)
    assert not refused["feasible"] and refused["errors"] and refused["job"]
    plan = Plan.from_dict(refused)
    _same_json(plan.to_dict(), refused)
    assert plan.policy is None and plan.predicted is None and plan.step_time_s is None
    assert plan.error_words() == "; ".join(e["msg"] for e in refused["errors"])


def test_a_plan_without_calibration_reads_and_writes_back_unchanged(x2):
    topo, _ = x2
    untimed = ap.plan_job(_cfg(), topo["nvlink"], None)
    plan = Plan.from_dict(untimed)
    _same_json(plan.to_dict(), untimed)
    assert plan.predicted.step_time_s is None and plan.predicted.spans is None and "spans" not in untimed["predicted"]
    assert ap.metrics_prediction(plan) == ap.metrics_prediction(untimed) == {}


# A plan as an older version stored it with a job: a policy without delivery_cast or staging_slots (and with the
# retired reduce_dtype), a prediction without spans, parts or bound, no job summary, basis or calibration note, and
# a key of the web service's own.
OLDER = {
    "feasible": True,
    "policy": {"delivery": "replicated", "grad_reduce": "host", "reduce_dtype": "fp32",
               "activations": ["keep", "checkpoint"], "resident": [True, False], "window": 2, "chunk_mb": 64,
               "loss_chunk_tokens": 2048},
    "predicted": {"step_time_s": 1.5, "phases": {"forward": 0.5, "backward": 1.0}, "exposed": {},
                  "tokens_per_s": 1000.0, "hbm_peak_gib": 3.0, "host_ram_gib": 12.0},
    "candidates": [{"policy": {"delivery": "replicated", "grad_reduce": "host", "edge_update": "host",
                               "device_layers": 0, "activations": ["keep", "checkpoint"], "resident": [True, False],
                               "window": 2, "chunk_mb": 64, "loss_chunk_tokens": 2048},
                    "predicted": {"step_time_s": 1.5, "host_ram_gib": 12.0}, "fits": True}],
    "why": "planned at submit",
    "errors": [],
    "calibration": "measured",
    "stage": "planned",
}


def test_an_older_plan_loads_and_writes_back_as_it_was():
    plan = Plan.from_dict(OLDER)
    _same_json(plan.to_dict(), OLDER)
    assert plan.marginal is None and plan.basis is None and plan.job is None
    assert plan.extra == {"stage": "planned"}
    assert plan.predicted.spans is None and plan.candidates[0].why_not is None
    assert ap.metrics_prediction(OLDER) == {"data": 0.0, "forward": 0.5, "backward": 1.0, "update_tail": 0.0,
                                            "delivery_wait": 0.0, "step_time_s": 1.5}


def test_a_key_set_on_a_plan_that_was_read_is_written_after_its_keys():
    plan = dataclasses.replace(Plan.from_dict(OLDER), replanned="the stored plan has no basis")
    out = plan.to_dict()
    assert list(out) == [*OLDER, "replanned"] and out["replanned"] == "the stored plan has no basis"


def test_a_plan_is_frozen(swept):
    plan = Plan.from_dict(swept)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.feasible = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.predicted.step_time_s = 0.0


@pytest.mark.parametrize("broken,named", [
    ({k: v for k, v in OLDER.items() if k != "feasible"}, "'feasible'"),
    ({**OLDER, "policy": None}, "'policy'"),
    ({k: v for k, v in OLDER.items() if k != "predicted"}, "'predicted'"),
    ({**OLDER, "predicted": {"host_ram_gib": 1.0}}, "'step_time_s'"),
    ({**OLDER, "candidates": [{k: v for k, v in OLDER["candidates"][0].items() if k != "fits"}]}, "'fits'"),
    ({**OLDER, "candidates": {"policy": {}}}, "'candidates'"),
], ids=["no feasible", "feasible without policy", "feasible without predicted", "prediction without step time",
        "candidate without fits", "candidates not a list"])
def test_what_is_not_a_plan_is_refused_naming_the_key(broken, named):
    with pytest.raises(PlanError, match=named):
        Plan.from_dict(broken)


def test_what_is_not_a_json_object_is_refused():
    with pytest.raises(PlanError, match="not a JSON object"):
        Plan.from_dict(["feasible", True])
    with pytest.raises(PlanError, match="prediction is not a JSON object"):
        Plan.from_dict({**OLDER, "predicted": 1.5})
