"""Building a JobConfig from a raw dict: each value coerced to its field's type and range-checked, section by
section, then the checks that span fields. Every problem is collected (the whole list is one ConfigError, with
each entry's location), so a user fixes a config in one pass. slidedp.config holds the schema itself and
imports this module (which therefore knows a JobConfig only by its fields).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # every integer key fits a signed 64-bit integer


def optional_section(tp: Any) -> Any:
    """The dataclass of an Optional[Section] type, else None."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]
    return None


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(tp) if a is not type(None)) + " or null"
    if origin is tuple:
        return "a list of " + str(len(get_args(tp))) + " numbers"
    if origin is list:  # of one item type; a choice of strings is "strings" (the choices are its range)
        item = get_args(tp)[0]
        kind = type(get_args(item)[0]) if get_origin(item) is Literal else item
        return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(kind, "values")
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _show(value: Any) -> str:
    """A value for an error message: short, and printable whatever it is (a huge int has no cheap str)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)  # escapes NUL and lone surrogates, so the message itself encodes as UTF-8
    except ValueError:
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 200 else text[:200] + "..."


def bad_character(text: str) -> str | None:
    """Why a string cannot be a config value (a NUL byte, a lone UTF-16 surrogate), or None when it can."""
    if "\x00" not in text:
        try:
            text.encode("utf-8")
            return None
        except UnicodeEncodeError:
            pass
    for i, ch in enumerate(text):
        if ch == "\x00":
            return f"contains a NUL character (\\x00) at position {i}"
        if "\ud800" <= ch <= "\udfff":
            return (f"contains a lone UTF-16 surrogate U+{ord(ch):04X} at position {i}, which is not a character "
                    "and cannot be encoded as UTF-8")
    return None


def _coerce(tp: Any, value: Any, loc: str, errors: list[dict[str, str]]) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, loc + ".", errors)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in get_args(tp) if a is not type(None)][0]
        return _coerce(inner, value, loc, errors)
    if origin is Literal:
        if value not in get_args(tp):
            errors.append({"loc": loc, "msg": f"must be {type_name(tp)}, got {_show(value)}"})
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            errors.append({"loc": loc, "msg": f"must be {type_name(tp)}, got {_show(value)}"})
            return value
        return tuple(_coerce(a, v, f"{loc}[{i}]", errors) for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            one = f": write [{json.dumps(value)}]" if isinstance(value, str) else ""
            errors.append({"loc": loc, "msg": f"must be {type_name(tp)}, got {_show(value)}{one}"})
            return value
        return [_coerce(get_args(tp)[0], v, f"{loc}[{i}]", errors) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            errors.append({"loc": loc, "msg": f"must be true or false, got {_show(value)}"})
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                errors.append({"loc": loc, "msg": f"must be an integer, got {_show(value)}"})
                return value
        if not INT64_MIN <= value <= INT64_MAX:  # every integer key fits a signed 64-bit integer
            errors.append({"loc": loc, "msg": f"must be an integer between {INT64_MIN} and {INT64_MAX} (signed "
                                              f"64-bit), got {_show(value)}"})
            return None  # no range message on top, and nothing downstream sees it
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append({"loc": loc, "msg": f"must be a number, got {_show(value)}"})
            return value
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the largest float
            number = float("inf")
        if number != number or number in (float("inf"), float("-inf")):
            errors.append({"loc": loc, "msg": f"must be a finite number, got {_show(value)}"})
            return None
        return number
    if tp is str:
        if not isinstance(value, str):
            errors.append({"loc": loc, "msg": f"must be a string, got {_show(value)}"})
            return value
        problem = bad_character(value)
        if problem:
            errors.append({"loc": loc, "msg": problem})
        return value
    return value


def _range_check(meta: dict[str, Any], value: Any, loc: str, errors: list[dict[str, str]]) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if "gt" in meta and not value > meta["gt"]:
        errors.append({"loc": loc, "msg": f"must be greater than {meta['gt']}, got {value}"})
    if "ge" in meta and not value >= meta["ge"]:
        errors.append({"loc": loc, "msg": f"must be at least {meta['ge']}, got {value}"})
    if "lt" in meta and not value < meta["lt"]:
        errors.append({"loc": loc, "msg": f"must be less than {meta['lt']}, got {value}"})
    if "le" in meta and not value <= meta["le"]:
        errors.append({"loc": loc, "msg": f"must be at most {meta['le']}, got {value}"})


def build(cls: Any, raw: Any, prefix: str, errors: list[dict[str, str]]) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(raw, dict):
        errors.append({"loc": where, "msg": f"must be a mapping of keys to values, got {type(raw).__name__}"})
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    retired = getattr(cls, "RETIRED", {})
    for key in raw:
        if key in retired and key not in fields:
            value, why = retired[key]
            if raw[key] != value:  # the one value it ever had is a no-op; anything else was never honoured
                errors.append({"loc": prefix + key, "msg": f"was removed: {why}; leave it out"})
            continue
        if key not in fields:
            name = key if isinstance(key, str) and bad_character(key) is None else _show(key)
            close = [n for n in fields if n.startswith(name[:3])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append({"loc": prefix + name, "msg": f"unknown key{hint}; allowed: {', '.join(fields)}"})
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        loc = prefix + name
        if name in raw:
            value = _coerce(hints[name], raw[name], loc, errors)
            _range_check(dict(f.metadata), value, loc, errors)
            kwargs[name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append({"loc": loc, "msg": "is required"})
    try:
        return cls(**kwargs)
    except TypeError:
        return None


def cross_checks(cfg: Any, errors: list[dict[str, str]]) -> None:
    if not cfg.model.strip():
        errors.append({"loc": "model", "msg": "must name a local model directory or a preset"})
    if not cfg.data.path.strip():
        errors.append({"loc": "data.path", "msg": "must name a dataset file"})
    for i, b in enumerate(cfg.optimizer.betas):
        if not 0.0 <= b < 1.0:
            errors.append({"loc": f"optimizer.betas[{i}]", "msg": f"must be in [0, 1), got {b}"})
    decay = cfg.optimizer.lr * cfg.optimizer.weight_decay
    if decay >= 1.0:
        errors.append({"loc": "optimizer.weight_decay", "msg": f"times optimizer.lr is {decay:.3g}: every step "
                       "multiplies each weight by 1 - lr x weight_decay, which would zero or flip the sign of every "
                       "weight; use a weight_decay below 1/lr (typically 0 to 0.1)"})
    if cfg.gpus > 0 and cfg.ranks != 1 and cfg.ranks != cfg.gpus:
        errors.append({"loc": "ranks", "msg": "is for CPU training (gpus = 0); with GPUs there is one rank per GPU"})
    if cfg.schedule.warmup_steps > cfg.steps:
        errors.append({"loc": "schedule.warmup_steps", "msg": f"is longer than the run ({cfg.steps} steps)"})
    if cfg.gpu_memory_gib is not None and cfg.gpus == 0:
        errors.append({"loc": "gpu_memory_gib", "msg": "caps the memory of each GPU, and this job runs on the "
                       "CPU (gpus = 0): remove gpu_memory_gib, or set gpus"})
    if cfg.policy.streamed_layers and cfg.world_size > 1 and cfg.policy.grad_reduce == "host":
        errors.append({"loc": "policy.streamed_layers", "msg": "layers whose update streams through the GPUs "
                       "reduce their gradients there: set policy.grad_reduce to gpu (or auto), or streamed_layers "
                       "to 0"})
    if cfg.policy.device_layers and cfg.world_size > 1 and cfg.policy.grad_reduce == "host":
        errors.append({"loc": "policy.device_layers", "msg": "layers updated on the GPUs reduce their gradients "
                       "there: set policy.grad_reduce to gpu (or auto), or device_layers to 0"})
    if cfg.policy.edge_update == "gpu" and cfg.world_size > 1 and cfg.policy.grad_reduce == "host":
        errors.append({"loc": "policy.edge_update", "msg": "gpu reduces the embedding and head gradients on the "
                       "GPUs: set policy.grad_reduce to gpu (or auto), or edge_update to host"})
    slots = cfg.policy.staging_slots
    if slots is not None and slots < cfg.policy.window + 1:
        errors.append({"loc": "policy.staging_slots", "msg": f"must be at least window + 1 = {cfg.policy.window + 1} "
                       f"(got {slots}): raise it, or leave it null for AutoPolicy to choose"})
    if cfg.policy.keep_layers is not None and cfg.policy.activations != "auto":
        errors.append({"loc": "policy.keep_layers", "msg": "only applies with policy.activations = auto"})
    if cfg.policy.cast_scratch_mb and cfg.policy.delivery_cast == "host":
        errors.append({"loc": "policy.cast_scratch_mb", "msg": "is the scratch of the weights' cast on the GPUs, and "
                       "policy.delivery_cast host casts them on the host: set delivery_cast to gpu (or auto), or "
                       "cast_scratch_mb to 0"})
    _eval_checks(cfg, errors)
    if cfg.report_to and "none" in cfg.report_to and len(set(cfg.report_to)) > 1:
        errors.append({"loc": "report_to", "msg": f"lists \"none\" with trackers ({json.dumps(cfg.report_to)}): "
                       "leave \"none\" out to report to them, or give [\"none\"] alone (or []) to report to none"})
    init = cfg.init_from
    if init is not None:
        if init.checkpoint is not None and not init.checkpoint.strip():
            errors.append({"loc": "init_from.checkpoint", "msg": "must name a checkpoint directory (or be null)"})
        elif init.job is None and init.checkpoint is None:
            errors.append({"loc": "init_from", "msg": "names no source: set init_from.checkpoint to a checkpoint "
                                                      "directory, or init_from.job to a workbench job id"})


def _eval_checks(cfg: Any, errors: list[dict[str, str]]) -> None:
    ev = cfg.eval
    if ev.path is not None and not ev.path.strip():
        errors.append({"loc": "eval.path", "msg": "must name an evaluation dataset file (or be null)"})
    if ev.path is not None and ev.holdout > 0:
        errors.append({"loc": "eval.holdout", "msg": f"is {ev.holdout:g} while eval.path is set: evaluate either on a "
                       "file of its own (eval.path) or on rows held out of the training data (eval.holdout), not "
                       "both; set holdout to 0 or path to null"})
    if not ev.keep_best:
        return
    if not ev.enabled:
        errors.append({"loc": "eval.keep_best", "msg": "needs evaluation: set eval.path or eval.holdout"})
    elif cfg.checkpoint.interval == 0:
        errors.append({"loc": "eval.keep_best", "msg": "keeps one of the run's checkpoints, and checkpoint.interval "
                       "is 0 (none are written): set checkpoint.interval > 0, or keep_best to false"})
    elif ev.interval == 0 or cfg.checkpoint.interval % ev.interval:
        why = ("is 0 (evaluation only before the first step and after the last)" if ev.interval == 0 else
               f"is {ev.interval}, which does not divide checkpoint.interval ({cfg.checkpoint.interval})")
        errors.append({"loc": "eval.keep_best", "msg": f"needs every checkpoint step evaluated, and eval.interval "
                       f"{why}: set eval.interval to {cfg.checkpoint.interval} or a divisor of it"})
