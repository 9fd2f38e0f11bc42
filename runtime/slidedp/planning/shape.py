"""Which calibration belongs to which job: the shape a calibration is measured at.

Imports no torch: the API matches a worker's calibrations to a job with it, and the calibration itself
(planning/calibration.py, which needs torch) writes it in its header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slidedp.planning.job import Job


def calibration_shape(cfg: Any, mc: dict[str, Any]) -> dict[str, Any]:
    """The job shape a calibration is measured at (its header's "shape")."""
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
