"""The job request schema, derived from the runtime's one job config (slidedp.config.JobConfig).

The runtime's dataclasses are the only definition of the keys, types, defaults, ranges and docs. Here they
are turned, field by field, into pydantic models so that the OpenAPI schema documents the request body;
validation itself is slidedp.validation.check_config (JobConfig.from_dict, and the model and dataset checks of
the keys that parsed) with the host's checks around it (slidedp_web.jobs.check_request), every problem answered
at once as a FastAPI-style 422: {"detail": [{"loc": ["body", "optimizer", "lr"], "msg": "...", "type": "..."}]}.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from functools import lru_cache
from typing import Any, Optional

import pydantic
from slidedp.config import JobConfig

from slidedp_web.errors import Unprocessable

# Keys the API accepts next to the config's own: they say how the job is filed, not how it trains.
EXTRA_KEYS = {
    "name": (Optional[str], pydantic.Field(None, max_length=200, description="A label for the job list.")),
    "host": (
        Optional[str],
        pydantic.Field(
            None, description="Worker host to run on (GET /api/hosts); default: the least busy one."
        ),
    ),
}


INT64_MAX = 2**63 - 1


def _is_int(tp: Any) -> bool:
    """int, or Optional[int]."""
    if tp is int:
        return True
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and int in typing.get_args(tp)


def _model_for(cls: Any, prefix: str) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        meta = dict(f.metadata)
        limits = {k: meta[k] for k in ("gt", "ge", "lt", "le") if k in meta}
        if _is_int(tp):  # what the config accepts: 64-bit integers (the database's INTEGER)
            limits.setdefault("le", INT64_MAX)
            if "gt" not in limits:
                limits.setdefault("ge", -INT64_MAX - 1)
        if tp is str and f.default is dataclasses.MISSING:
            limits["pattern"] = r"\S"  # a required path or name may not be blank
        doc = meta.get("doc") or None
        if dataclasses.is_dataclass(tp):
            tp = _model_for(tp, prefix + tp.__name__)
        if f.default is not dataclasses.MISSING:
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            fields[f.name] = (tp, pydantic.Field(default, description=doc, **limits))
        elif f.default_factory is not dataclasses.MISSING:
            # A section with all-default keys: the model itself builds the default.
            factory = tp if dataclasses.is_dataclass(f.default_factory) else f.default_factory
            fields[f.name] = (tp, pydantic.Field(default_factory=factory, description=doc, **limits))
        else:
            fields[f.name] = (tp, pydantic.Field(..., description=doc, **limits))
    name = prefix if prefix.endswith("Config") else prefix + "Config"
    return pydantic.create_model(name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)


@lru_cache(maxsize=1)
def job_create_model() -> type[pydantic.BaseModel]:
    """JobCreate: every JobConfig key (nested sections as their own schemas) plus `name` and `host`."""
    base = _model_for(JobConfig, "Job")
    return pydantic.create_model("JobCreate", __base__=base, **EXTRA_KEYS)


def openapi_components() -> dict[str, Any]:
    """JSON schemas of JobCreate and its sections, for the OpenAPI document's components."""
    schema = job_create_model().model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {"JobCreate": schema, **defs}


def request_body_openapi(description: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobCreate"}}},
        }
    }


# --------------------------------------------------------------------------------------------- validation
def loc_path(loc: str) -> list[str | int]:
    """'optimizer.betas[1]' -> ['body', 'optimizer', 'betas', 1] (FastAPI's loc, after 'body')."""
    out: list[str | int] = ["body"]
    if loc in ("", "config"):
        return out
    for part in loc.split("."):
        m = re.fullmatch(r"(.*?)((?:\[\d+\])*)", part)
        head, idx = (m.group(1), m.group(2)) if m else (part, "")
        if head:
            out.append(head)
        out.extend(int(i) for i in re.findall(r"\[(\d+)\]", idx))
    return out


def _error_type(msg: str) -> str:
    if msg.startswith("unknown key"):
        return "extra_forbidden"
    if msg == "is required":
        return "missing"
    return "value_error"


def unprocessable(errors: list[dict[str, Any]]) -> Unprocessable:
    """A 422 naming each bad field by its config key path."""
    return Unprocessable(
        [
            {"loc": loc_path(str(e.get("loc", ""))), "msg": str(e["msg"]), "type": _error_type(str(e["msg"]))}
            for e in errors
        ]
    )


def split_body(body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config keys, filing keys) of a request body; a body that is not a JSON object is a 422."""
    if not isinstance(body, dict):
        raise Unprocessable(
            [
                {
                    "loc": ["body"],
                    "type": "dict_type",
                    "msg": f"must be a JSON object of job config keys, got {type(body).__name__}",
                }
            ]
        )
    errors = text_errors(body, "")
    if errors:
        raise unprocessable(errors)
    extra = {k: body[k] for k in EXTRA_KEYS if k in body}
    for key, value in extra.items():
        if value is not None and not isinstance(value, str):
            errors.append({"loc": key, "msg": f"must be a string or null, got {value!r}"})
    if isinstance(extra.get("name"), str) and len(extra["name"]) > 200:
        errors.append({"loc": "name", "msg": "must be at most 200 characters"})
    if errors:
        raise unprocessable(errors)
    return {k: v for k, v in body.items() if k not in EXTRA_KEYS}, extra


def _bad_character(text: str) -> Optional[str]:
    if "\x00" in text:
        return "a NUL character (\\u0000)"
    for ch in text:
        if "\ud800" <= ch <= "\udfff":
            return f"a lone UTF-16 surrogate (\\u{ord(ch):04x}), which is not a character"
    return None


def text_errors(value: Any, loc: str, depth: int = 0) -> list[dict[str, Any]]:
    """[{"loc", "msg"}] for every string (keys too) in a request body that a database, a path or a UTF-8 log line
    cannot hold: a NUL character or a lone surrogate. The message never repeats the string itself."""
    if depth > 32:
        return [{"loc": loc or "body", "msg": "is nested too deeply"}]
    if isinstance(value, str):
        bad = _bad_character(value)
        return [{"loc": loc or "body", "msg": f"contains {bad}; send plain text"}] if bad else []
    out: list[dict[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            bad = _bad_character(str(key))
            if bad:
                out.append({"loc": loc or "body", "msg": f"has a key that contains {bad}"})
                continue
            out += text_errors(item, f"{loc}.{key}" if loc else str(key), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += text_errors(item, f"{loc}[{i}]", depth + 1)
    return out
