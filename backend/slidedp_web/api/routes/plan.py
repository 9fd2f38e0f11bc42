from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body
from fastapi.exceptions import RequestValidationError
from slidedp.config import ConfigError, JobConfig

from slidedp_web import jobs, planning
from slidedp_web.api.deps import SessionDep, SettingsDep
from slidedp_web.guards import check_roots
from slidedp_web.job_schema import request_body_openapi, run_job_checks, split_body, unprocessable

router = APIRouter(prefix="/plan", tags=["plan"])


@router.post(
    "", openapi_extra=request_body_openapi("A job config (as for POST /api/jobs), optionally `host`.")
)
def plan(session: SessionDep, settings: SettingsDep, body: Any = Body(...)) -> dict[str, Any]:
    """The AutoPolicy dry run for a job on a host, from the host's reported topology and calibration.

    Bad config keys and an unusable model are a 422; other findings (dataset, memory) come back in the
    plan's `validation` list so the form can show them next to the plan.
    """
    raw, extra = split_body(body)
    check_roots(settings, raw)  # before anything reads the paths it names
    try:
        cfg = JobConfig.from_dict(raw)
    except ConfigError as exc:
        raise unprocessable(exc.errors) from exc
    host = planning.choose_host(session, settings, extra.get("host"))
    jobs.check_host_limits(settings, cfg, host)
    findings = run_job_checks(cfg, planning.host_ram_bytes(host))
    model_errors = [e for e in findings if e["loc"] in ("model", "seq_len")]
    if model_errors:
        raise unprocessable(model_errors)
    try:
        result = planning.plan_preview(cfg, host, settings)
    except (ValueError, KeyError) as exc:
        raise RequestValidationError(
            [{"loc": ["body"], "msg": f"cannot plan this job: {exc}", "type": "value_error"}]
        ) from exc
    return {**result, "validation": findings}
