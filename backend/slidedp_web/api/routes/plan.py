from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body
from fastapi.exceptions import RequestValidationError
from slidedp.validation import job_warnings

from slidedp_web import jobs, planning
from slidedp_web.api.deps import SessionDep, SettingsDep
from slidedp_web.job_schema import request_body_openapi, unprocessable

router = APIRouter(prefix="/plan", tags=["plan"])


@router.post(
    "",
    openapi_extra=request_body_openapi(
        "A job config (as for POST /api/jobs), optionally `host`, or `profile`: a shipped hardware profile's name "
        "(GET /api/profiles) to plan for that declared host instead of a reported one."
    ),
)
def plan(session: SessionDep, settings: SettingsDep, body: Any = Body(...)) -> dict[str, Any]:
    """The AutoPolicy dry run for a job on a host, from the host's reported topology and calibration.

    What a plan cannot be made without (config keys that do not parse, paths outside the allowed folders, an
    unknown host, the host's limits, an unusable model or seq_len) is a 422 listing every problem found. Otherwise
    the answer opens with `problems` (what POST /api/jobs would refuse the job for: a dataset, say; `feasible` is
    then false) and `warnings` (what does not stop it), before the plan itself; `fits` is the plan's own verdict.

    With `profile` (a shipped profile's name, never a path) the job is planned for that declared host: its topology
    and every time figure come from the profile, none from this deployment's hosts, and the plan says so under
    `declared` and `calibration: "declared"`.
    """
    declared = planning.declared_host(body)
    checked = jobs.check_request(settings, session, body, declared=declared)
    if not checked.plannable:
        raise unprocessable(checked.errors)
    if checked.plan is None:
        raise RequestValidationError(
            [{"loc": ["body"], "msg": f"cannot plan this job: {checked.plan_failure}", "type": "value_error"}]
        )
    assert checked.config is not None
    result = checked.plan
    warnings = job_warnings(checked.config) + planning.plan_warnings(result)
    return {
        "problems": checked.errors,
        "warnings": warnings,
        "feasible": bool(result.get("feasible")) and not checked.errors,
        "fits": result.get("feasible"),
        **{k: v for k, v in result.items() if k != "feasible"},
        "validation": checked.validation,
    }
