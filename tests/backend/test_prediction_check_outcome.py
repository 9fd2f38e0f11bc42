"""A run's check of its prediction (TrainResult.prediction_check) is kept in the job's policy column beside the plan
it checks, and an attempt without one does not keep an earlier attempt's (docs/interfaces.md §2, §6)."""

from __future__ import annotations

from slidedp.policy import ExecutionPolicy
from slidedp.train_result import TrainResult
from slidedp_web.job_process import _trained_outcome
from slidedp_web.planning import job_policy

CHECK = {"steps": [3, 10], "prediction_error": -0.145, "host_factor": 1.0,
         "message": "steps 3-10: median step 1.170 s, predicted 1.000 s (-14.5%)"}


def _result(check):
    policy = ExecutionPolicy.default(2)
    return TrainResult("completed", 10, [], "/tmp/x", None, None, policy, {"feasible": True, "why": "planned"},
                       prediction_check=check)


def test_the_policy_column_after_a_run_holds_its_prediction_check():
    out = _trained_outcome(None, 1, _result(CHECK), None)["policy"]
    assert out["stage"] == "resolved" and out["prediction_check"] == CHECK
    assert job_policy(out)["prediction_check"] == CHECK  # what GET /api/jobs/{id} answers as `policy`


def test_an_attempt_without_a_check_replaces_an_earlier_one():
    # the column is merged with what was stored: the key is written either way, so an old check does not survive
    out = _trained_outcome(None, 1, _result(None), {"prediction_check": CHECK})["policy"]
    assert "prediction_check" in out and out["prediction_check"] is None
