"""Which calibration belongs to which job: the shape a calibration is measured at.

Imports no torch: the API matches a worker's calibrations to a job with it, and the calibration itself
(planning/calibration.py, which needs torch) writes it in its header. A record an older runtime wrote without some
of the shape's fields is completed from its model's config (upgrade_calibration) or marked outdated, and a record
that does not match a job says where in words (shape_differences).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slidedp.planning.job import Job


def calibration_shape(cfg: Any, mc: dict[str, Any]) -> dict[str, Any]:
    """The job shape a calibration is measured at (its header's "shape"), the model's keys as transformers reads
    them (slidedp.model_shape.sizing_config: defaults for the keys a config.json leaves out)."""
    from slidedp.model_sizing import sizing_config

    mc = sizing_config(mc)
    return {
        "model": cfg.model,
        "arch": mc.get("model_type"),
        "micro_batch": cfg.micro_batch_size,
        "seq": cfg.seq_len,
        "hidden": int(mc["hidden_size"]),
        "intermediate": int(mc["intermediate_size"]),
        "heads": int(mc["num_attention_heads"]),
        "kv_heads": int(mc.get("num_key_value_heads") or mc["num_attention_heads"]),
        "layers": int(mc["num_hidden_layers"]),
        "vocab": int(mc["vocab_size"]),
        "precision": cfg.precision,
    }


def shape_matches(job: Job, calibration: dict[str, Any] | None) -> bool:
    """Whether the calibration's per-unit figures (times, saved bytes) were measured at this job's shape."""
    if not calibration or not calibration.get("shape"):
        return False
    s = calibration["shape"]
    return (
        s.get("micro_batch"),
        s.get("seq"),
        s.get("hidden"),
        s.get("intermediate"),
        s.get("precision"),
    ) == (
        job.micro_batch,
        job.seq,
        job.hidden,
        int(job.model_cfg.get("intermediate_size", -1)),
        job.precision,
    )


# The calibration JSON's schema this runtime writes (calibration.py keeps the history of each version). A record of
# an older schema still prices a plan preview; a run measures its shape again before it trains.
SCHEMA_VERSION = 7

# Shape fields that a record written before they existed lacks, and the model config key each comes from. The
# architecture (model_type) is filled in too when the config names one; a config without it leaves it unset, as
# calibration_shape does for the job.
DERIVED_FIELDS = {
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "layers": "num_hidden_layers",
    "vocab": "vocab_size",
}
# What a derived field must agree with first: the fields such a record has, read from the same config.
CHECKED_FIELDS = {"hidden": "hidden_size", "intermediate": "intermediate_size", "layers": "num_hidden_layers"}

# How a person reads each field of a shape.
FIELD_WORDS = {
    "model": "model",
    "arch": "architecture",
    "micro_batch": "micro-batch",
    "seq": "sequence length",
    "hidden": "hidden size",
    "intermediate": "intermediate size",
    "heads": "attention heads",
    "kv_heads": "KV heads",
    "layers": "layers",
    "vocab": "vocabulary",
    "precision": "precision",
}


def upgrade_calibration(calibration: dict[str, Any]) -> dict[str, Any]:
    """The record with its shape completed from its model's config where an older runtime wrote it without some
    fields (heads, kv_heads, vocab, ...): `shape_upgraded` names the fields filled in. A record whose missing fields
    cannot be derived (its model config is not known here, or disagrees with the fields it has) comes back with
    `outdated`, the reason in words, and its shape as it was."""
    from slidedp.presets import model_config_dict

    shape = calibration.get("shape")
    if not isinstance(shape, dict):
        return {**calibration, "outdated": "it records no job shape"}
    missing = [f for f in DERIVED_FIELDS if shape.get(f) is None]
    if not missing:
        return calibration  # written by this runtime, or upgraded already
    try:
        mc = model_config_dict(str(shape.get("model")))
    except (OSError, KeyError, ValueError) as exc:
        return {
            **calibration,
            "outdated": f"it lacks {_fields(missing)} and the config of model "
            f"{shape.get('model')!r} is not known here to derive them ({exc})",
        }
    for field, key in CHECKED_FIELDS.items():
        if shape.get(field) is not None and mc.get(key) is not None and int(shape[field]) != int(mc[key]):
            return {
                **calibration,
                "outdated": f"it lacks {_fields(missing)}, and its {FIELD_WORDS[field]} "
                f"{shape[field]} is not the {mc[key]} of {shape.get('model')}'s config",
            }
    derived = {f: mc.get(key) for f, key in DERIVED_FIELDS.items()}
    derived["kv_heads"] = derived["kv_heads"] or derived["heads"]  # no GQA: as many KV heads as heads
    lacking = [f for f in missing if derived[f] is None]
    if lacking:
        return {
            **calibration,
            "outdated": f"it lacks {_fields(lacking)}, which {shape.get('model')}'s config does not give",
        }
    filled = {f: int(derived[f]) for f in missing}
    if shape.get("arch") is None and mc.get("model_type"):
        filled["arch"] = mc["model_type"]
    return {**calibration, "shape": {**shape, **filled}, "shape_upgraded": list(filled)}


def shape_differences(wanted: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """Where a record's shape differs from the job's, in words ("micro-batch 8, not 4"), in the shape's order."""
    return [
        f"{FIELD_WORDS.get(k, k)} {have.get(k) if have.get(k) is not None else 'not recorded'}, not {v}"
        for k, v in wanted.items()
        if have.get(k) != v
    ]


def _fields(fields: list[str]) -> str:
    names = [FIELD_WORDS.get(f, f) for f in fields]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
