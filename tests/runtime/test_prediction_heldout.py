"""The step-time model against measured steps it was not fitted to.

tests/runtime/fixtures/h200x1_heldout_steps.json: every SlideDP row of docs/results sessions s7, s9 and s12 on the
one-GPU machine (Qwen3-1.7B at micro-batch 4 and 8, Qwen3-4B at 8, Qwen3-8B at 1 under a 24 GiB cap with the cast on
the GPU), each with the policy the run resolved to and the calibration measured in its session. These rows were set
aside before the model's terms were last changed (scripts/prediction_check.py says how they are chosen and
re-predicts every other row); each is planned again here with that calibration and the machine's topology, and the
predicted step must lie within 10% of the measured one."""

import json
import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
TOLERANCE = 0.10

with open(os.path.join(FIX, "h200x1_heldout_steps.json")) as fh:
    HELD_OUT = json.load(fh)

# Rows the model misses by more than 10%, each with its error when this set was first predicted. All are steps the
# host update binds (every layer checkpointed and its update on the host, or 7 device layers at micro-batch 4), and
# in each the updater's measured busy time exceeds what the model charges by 14-37%: the host update runs slower in
# these steps than the calibration's `update_in_step` rate (or, in the schema-4 gil17 calibration, which has none,
# than its `cpu` rate), the drift the development rows show too (docs/notebook/prediction-check-2026-12-04.md).
# ins17.jsonl:3 is also the run-to-run spread: the same policy with a calibration of the same host key measured
# 0.876 s in ins17-repeat (predicted within 2.4%) against 1.028 s here. Not fixed by a constant fitted here; a GPU
# run that times the updater in the step beside its calibration would settle which figure is wrong. The two gil17
# rows of this kind (-12.4%, -10.8% when first predicted) came within 10% (-8.8%, -7.2%) once the layers' backward
# was charged as step timelines measure it inside the step (cost_model.IN_STEP_BACKWARD, derived from other sessions).
MISSED = {
    "docs/results/s7/ins17-bs4/ins17.jsonl:1": "-11.2%: host update busy 0.404 s measured, 0.355 s charged",
    "docs/results/s7/ins17-bs4/ins17.jsonl:3": "-14.4%: host update busy 0.656 s measured, 0.568 s charged",
    "docs/results/s7/ins17/ins17.jsonl:3": "-18.5%: host update busy 0.839 s measured, 0.629 s charged; the same "
                                           "policy measured 0.876 s in ins17-repeat",
}


def _rows() -> list:
    out = []
    for row in HELD_OUT["rows"]:
        why = MISSED.get(row["source"])
        marks = [pytest.mark.xfail(strict=True, reason=f"the model misses this row by {why}")] if why else []
        out.append(pytest.param(row, marks=marks, id=row["source"].removeprefix("docs/results/")))
    return out


@pytest.mark.parametrize("row", _rows())
def test_the_planner_predicts_a_held_out_measured_step_within_ten_percent(one_h200, row):
    topo, _ = one_h200
    plan = ap.plan_job(JobConfig.from_dict(row["config"]), topo, HELD_OUT["calibrations"][row["calibration"]])
    assert plan["feasible"] and plan["calibration"] == "measured", plan["errors"]
    for key in ("delivery_cast", "edge_update", "device_layers", "window"):
        assert plan["policy"][key] == row["chosen"][key], key  # planned as it ran
    predicted, measured = plan["predicted"]["step_time_s"], row["measured_step_s"]
    error = predicted / measured - 1
    assert abs(error) <= TOLERANCE, f"predicted {predicted:.3f} s against {measured:.3f} s measured: {error:+.1%}"


def test_the_held_out_set_covers_the_machines_models_and_step_kinds():
    """The set is not a handful of easy rows: three models, both host-bound and compute-bound policies, a memory
    cap, and every session's rows, none dropped."""
    rows = HELD_OUT["rows"]
    assert len(rows) == 22
    assert {r["config"]["model"] for r in rows} == {"qwen3-1.7b", "qwen3-4b", "qwen3-8b"}
    assert any(r["config"].get("gpu_memory_gib") for r in rows)
    assert {r["chosen"]["device_layers"] for r in rows} >= {0, 7, 28}
    assert set(MISSED) <= {r["source"] for r in rows}
    assert len(MISSED) <= 5  # a sixth row outside 10% is a regression to look at, not one more mark
