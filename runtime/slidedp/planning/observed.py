"""What a run measured against what its plan predicted, and the host speed a run observed, kept for later plans.
Imports no torch.

Every metrics record carries the plan's prediction (docs/interfaces.md §3, `predicted`). At the end of a run,
`prediction_check` sets the steady steps' medians beside it, term by term: the step, its forward and backward spans
and the host updater's busy time. The host term is the one that drifts (docs/notebook/prediction-check-2026-12-04.md:
two calibrations of one host minutes apart differed by up to 40% in host memory's capacity, and clipped runs kept
the updater busy 1.2-1.4x what the calibration charged): the updater's measured busy time over the busy time the
plan charged it is the factor by which this host's memory work ran slower (above 1) or faster than calibrated.

A GPU run writes that factor into the calibration it was planned with (`observed_host`, one list per clipping
state, the last OBSERVATIONS_KEPT runs), and Rates (planning/cost_model.py) prices the host's memory work of later
plans of that calibration at the median factor (`observed_factor`): the host is priced from what runs on it
measured, not only from the seconds its calibration timed. A new calibration starts without observations.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from datetime import datetime, timezone
from typing import Any

from slidedp.planning.basis import calibration_digest

# the first records of a run carry its start-up (moments paged in, the allocator growing, compiled kernels)
STEADY_FROM = 2
MIN_STEADY = 3  # fewer steady steps than this: no check
MIN_OBSERVED = 5  # fewer than this: the check is said, but no host factor is kept from it
OBSERVATIONS_KEPT = 5
FACTOR_RANGE = (0.5, 2.0)  # a factor outside it is a broken measurement, not a host: not kept
PREDICTION_BAND = 0.05  # a step within it of its prediction is "as predicted"
HOST_DRIFT = 0.10  # a host term further off than this is named as the step's drift


def clip_key(clip: bool) -> str:
    return "clipped" if clip else "unclipped"


def _median(values: list[float]) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(values) if values else None


def _term(measured: float | None, predicted: Any) -> dict[str, float] | None:
    if measured is None or not isinstance(predicted, (int, float)) or not predicted > 0:
        return None
    return {"measured_s": measured, "predicted_s": float(predicted), "ratio": measured / float(predicted)}


def prediction_check(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's steady steps against their prediction; None when the records carry no prediction or fewer than
    MIN_STEADY steps follow the first STEADY_FROM of this run.

    {"steps": [first, last], "step_time": term, "forward": term, "backward": term, "host_update": term,
    "host_factor": the factor the plan already priced the host at (1 without observations),
    "prediction_error": predicted / measured step - 1, "message": str},
    each term {"measured_s", "predicted_s", "ratio"} (medians over the steady steps; None where not measured)."""
    steady = [r for r in records[STEADY_FROM:] if (r.get("predicted") or {}).get("step_time_s")]
    if len(steady) < MIN_STEADY:
        return None
    pred = steady[-1]["predicted"]

    def measured(key: str) -> float | None:
        return _median([(r.get("phases") or {}).get(key) for r in steady])

    step = _term(_median([r.get("step_time_s") for r in steady]), pred.get("step_time_s"))
    if step is None:
        return None
    out: dict[str, Any] = {
        "steps": [int(steady[0]["step"]), int(steady[-1]["step"])],
        "step_time": step,
        "forward": _term(measured("forward"), pred.get("forward_span")),
        "backward": _term(measured("backward"), pred.get("backward_span")),
        "host_update": _term(measured("update_busy"), pred.get("update_busy")),
        "host_factor": float(pred.get("host_factor") or 1.0),
    }
    # as slidedp bench's predicted_error: predicted / measured - 1 (negative: the step ran longer than predicted)
    out["prediction_error"] = 1.0 / out["step_time"]["ratio"] - 1.0
    out["message"] = _words(out)
    return out


def _words(check: dict[str, Any]) -> str:
    step = check["step_time"]
    first, last = check["steps"]
    err = check["prediction_error"]
    text = (
        f"steps {first}-{last}: median step {step['measured_s']:.3f} s, predicted {step['predicted_s']:.3f} s "
        f"({err:+.1%}); measured / predicted:"
    )
    parts = []
    for name, label in (("forward", "forward"), ("backward", "backward"), ("host_update", "host update busy")):
        t = check[name]
        if t is not None:
            parts.append(f" {label} {t['measured_s']:.3f} / {t['predicted_s']:.3f} s ({t['ratio']:.2f}x)")
    text += ",".join(parts)
    host = check["host_update"]
    if abs(err) <= PREDICTION_BAND:
        return text + ": as predicted"
    if host is not None and abs(host["ratio"] - 1.0) > HOST_DRIFT:
        slower = "slower" if host["ratio"] > 1 else "faster"
        return (
            text + f": the host update ran {host['ratio']:.2f}x the time the plan charged (this host's memory "
            f"{slower} now than when it was calibrated)"
        )
    worst = max(
        (n for n in ("forward", "backward") if check[n] is not None),
        key=lambda n: abs(check[n]["ratio"] - 1.0),
        default=None,
    )
    return text if worst is None else text + f": the {worst} differs most from its prediction"


def host_observation(check: dict[str, Any] | None) -> float | None:
    """The factor this run observed for the host's memory work, against the calibration's own seconds (the plan's
    factor times the run's measured / charged busy time); None when the run has no such measure, fewer than
    MIN_OBSERVED steady steps, or a factor out of FACTOR_RANGE."""
    host = (check or {}).get("host_update")
    if not host or check["steps"][1] - check["steps"][0] + 1 < MIN_OBSERVED:
        return None
    factor = host["ratio"] * float(check.get("host_factor") or 1.0)
    lo, hi = FACTOR_RANGE
    return factor if lo <= factor <= hi else None


def observed_factor(calibration: dict[str, Any] | None, clip: bool) -> float:
    """The host factor a plan of this calibration charges: the median of the factors runs observed with the same
    clipping (observed_host), 1 without any."""
    rows = ((calibration or {}).get("observed_host") or {}).get(clip_key(clip)) or []
    lo, hi = FACTOR_RANGE
    factors = [r.get("factor") for r in rows if isinstance(r, dict)]
    factor = _median([f for f in factors if isinstance(f, (int, float)) and lo <= f <= hi])
    return factor if factor is not None else 1.0


def observations(calibration: dict[str, Any] | None, clip: bool) -> int:
    rows = ((calibration or {}).get("observed_host") or {}).get(clip_key(clip)) or []
    return len([r for r in rows if isinstance(r, dict)])


def record_observation(path: str, basis_digest: str | None, clip: bool, factor: float, steps: int) -> bool:
    """Adds a run's factor to the calibration file at `path` when it is still the calibration the run was planned
    with (its calibration_digest equals the plan's basis entry `basis_digest`); False (nothing written) when it is
    not, or the file is gone or unreadable. Two runs ending at once may each add theirs to the same reading of the
    file, and one of the two is then lost: an observation, not a figure any plan needs."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or basis_digest is None or calibration_digest(record) != basis_digest:
        return False
    kept = dict(record.get("observed_host") or {})
    rows = [r for r in kept.get(clip_key(clip)) or [] if isinstance(r, dict)]
    rows.append(
        {
            "factor": round(float(factor), 4),
            "steps": int(steps),
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    kept[clip_key(clip)] = rows[-OBSERVATIONS_KEPT:]
    record["observed_host"] = kept
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".calib-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    os.replace(tmp, path)  # atomic, as calibration.save_calibration writes: a reader never sees half a file
    return True
