"""What a run measured against what its plan predicted, and the host speed a run observed, kept with the
calibration. Imports no torch.

Every metrics record carries the plan's prediction (docs/interfaces.md §3, `predicted`). At the end of a run,
`prediction_check` sets the steady steps' medians beside it, term by term: the step, its forward and backward spans
and the host updater's busy time. The host term is the one that drifts (docs/notebook/prediction-check-2026-12-04.md:
two calibrations of one host minutes apart differed by up to 40% in host memory's capacity, and clipped runs kept
the updater busy 1.2-1.4x what the calibration charged).

A GPU run writes its updater's measured busy time over the busy time its plan charged (the host factor) into the
calibration it was planned with (`observed_host`, one list per clipping state, the last OBSERVATIONS_KEPT runs).
No plan is priced with it: charged to the host update of later plans, it centred the rows already measured when
each was planned again with the policy it ran, but on a live pair the clipped plan it priced moved two more layers
onto the GPU stream, and that plan's updater was again busy 1.17x its charge (the notebook's 2026-12-07 entry). It
is kept for the Hosts page.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from slidedp import atomic_file
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
    }
    # as slidedp bench's predicted_error: predicted / measured - 1 (negative: the step ran longer than predicted)
    out["prediction_error"] = 1.0 / step["ratio"] - 1.0
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
        return text + f": the host update ran {host['ratio']:.2f}x the time the plan charged"
    worst = max(
        (n for n in ("forward", "backward") if check[n] is not None),
        key=lambda n: abs(check[n]["ratio"] - 1.0),
        default=None,
    )
    return text if worst is None else text + f": the {worst} differs most from its prediction"


def host_observation(check: dict[str, Any] | None) -> float | None:
    """The host factor this run observed: its updater's measured over charged busy time; None when the run has no
    such measure, fewer than MIN_OBSERVED steady steps, or a factor out of FACTOR_RANGE."""
    host = (check or {}).get("host_update")
    if not host or check["steps"][1] - check["steps"][0] + 1 < MIN_OBSERVED:
        return None
    lo, hi = FACTOR_RANGE
    return host["ratio"] if lo <= host["ratio"] <= hi else None


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
    atomic_file.write_json(path, record)  # as calibration.save_calibration writes it, without importing torch
    return True


def check_run(cfg: Any, plan: dict, detected: Any, records: list[dict], on_log: Callable[[str], None] | None
              ) -> dict | None:
    """What train() does with a run's records once its state is saved: the prediction check, said in the log; on
    GPUs the host factor the run observed added to the calibration the plan was priced with (`detected`: the
    launcher's future of this host's topology, which names the calibration's file). A calibration that changed
    since the plan, or one that cannot be written, is left as it is (the log says so); a record the check cannot
    read costs the check, not the run."""

    def say(line: str) -> None:
        if on_log is not None:
            on_log(line)

    try:
        check = prediction_check(records)
    except Exception as exc:  # noqa: BLE001 - a record the check cannot read costs the check, not the run
        say(f"prediction: not checked ({type(exc).__name__}: {exc})")
        return None
    if check is None:
        return None
    say(f"prediction: {check['message']}")
    factor = host_observation(check)
    if factor is None or cfg.gpus == 0 or detected is None or "fallback" in plan or not plan.get("basis"):
        return check
    try:
        from slidedp.planning import calibration as calib

        path = calib.cache_path(cfg, detected.result())
        first, last = check["steps"]
        kept = record_observation(path, plan["basis"].get("calibration"), cfg.optimizer.max_grad_norm > 0, factor,
                                  last - first + 1)
    except Exception as exc:  # noqa: BLE001 - the run has trained: a cache that cannot be written only loses this
        say(f"the host factor this run observed ({factor:.3f}) was not kept: {type(exc).__name__}: {exc}")
        kept = False
    if kept:
        say(f"host factor {factor:.3f} (the updater's busy time over its plan's charge) kept with this host's "
            f"calibration ({os.path.basename(path)})")
    return check
