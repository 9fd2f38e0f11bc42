"""Read a step timeline (SLIDEDP_TRACE, slidedp/step/trace.py) and say where the host updater idled.

Usage: python scripts/trace_report.py TIMELINE.jsonl [--from-step 3]
       python scripts/trace_report.py TIMELINE.jsonl --layers [--calibration CALIBRATION.json]

Per step (from the end of one backward on the compute stream to the next), it prints the updater's busy and idle
seconds, the idle split into before the step's first gradient was in hand and between gradients, the unit the
updater finished last before the step's first gradient, and the time from that update to the forward's end.
Medians over the steps from --from-step on close the report.

--layers: where the compute stream's time went, layer by layer (the timeline's "layer" events): per direction
(forward, backward) and activation kind, how many layer runs, the median of a layer's own time (its kernels, ready
to end) and of the time the stream spent before it (waiting for its weights or a gradient buffer, and the work
between two layers), and per step their sums against the forward and backward spans. With the calibration the
run was planned with, each median stands beside the layer time the planner used (unit or unit_compiled, as the
run's layers ran) and their ratio: above 1, the layers ran slower in the step than in calibration.

The FLOP rate of the compute phases: where the timeline says what one layer's forward costs (its run record's
layer_forward_flops; for a timeline written before it carried that, give --model, --micro-batch and --seq), each
median and each step also get TFLOP/s. `model_tflops` counts the model's own work (a forward once, a backward
twice the forward), `work_tflops` also the recompute a checkpointed layer's backward runs (once more the forward),
both over the layers' own time: how near the layers' kernels run to the GPU's ceiling, waits and the work between
layers left out.
"""

from __future__ import annotations

import argparse
import json
import statistics


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def report(rows: list[dict], first: int) -> list[dict]:
    gpu = {r["step"]: r for r in rows if r["kind"] == "gpu"}
    work = sorted((r for r in rows if r["kind"] in ("update", "hold", "final", "moments")), key=lambda r: r["t0"])
    out = []
    for s in sorted(gpu):
        if s < first or s + 1 not in gpu or "backward_end" not in gpu[s] or "backward_end" not in gpu[s + 1]:
            continue
        lo, hi = gpu[s]["backward_end"], gpu[s + 1]["backward_end"]
        inside = [w for w in work if w["t1"] > lo and w["t0"] < hi]
        busy = sum(min(w["t1"], hi) - max(w.get("landed", w["t0"]), lo) for w in inside
                   if min(w["t1"], hi) > max(w.get("landed", w["t0"]), lo))
        nxt = [w for w in inside if w["step"] == s + 1]
        first_in = min((w.get("landed", w["t0"]) for w in nxt), default=hi)
        # what the next forward waits for: a unit's update, or after the norm its weights pass (not its moments)
        before = [w for w in inside if w["step"] == s and w["kind"] != "moments"]
        last_before = max(before, key=lambda w: w["t1"]) if before else None
        last_t = last_before["t1"] if last_before else lo
        out.append({"step": s + 1, "period_s": hi - lo, "updater_busy_s": busy, "idle_s": (hi - lo) - busy,
                    "idle_before_first_gradient_s": max(0.0, first_in - last_t),
                    "last_unit_before": last_before["unit"] if last_before else None,
                    "forward_end_after_last_update_s": gpu[s + 1].get("forward_end", hi) - last_t,
                    "leftover_units": len(before)})
    return out


# the calibration's layer time for a layer run of (direction, activations): an offloaded layer computes as a kept one
_CALIBRATED = {("forward", "keep"): "fwd_keep_s", ("forward", "offload"): "fwd_keep_s",
               ("forward", "checkpoint"): "fwd_checkpoint_s", ("backward", "keep"): "bwd_keep_s",
               ("backward", "offload"): "bwd_keep_s", ("backward", "checkpoint"): "bwd_checkpoint_s"}


# One layer run's FLOPs in units of its forward: (the model's work, the work done, a checkpointed backward's
# recompute included), by (direction, activations).
_FORWARDS = {("forward", "keep"): (1, 1), ("forward", "offload"): (1, 1), ("forward", "checkpoint"): (1, 1),
             ("backward", "keep"): (2, 2), ("backward", "offload"): (2, 2), ("backward", "checkpoint"): (2, 3)}


def forward_flops(rows: list[dict], model: str | None = None, micro_batch: int | None = None,
                  seq: int | None = None) -> float | None:
    """One decoder layer's forward over one micro-batch in FLOPs: the run record's figure, else the model's shape
    at (micro_batch, seq) where all three are given, else None."""
    run = next((r for r in rows if r["kind"] == "run"), {})
    if run.get("layer_forward_flops"):
        return float(sum(run["layer_forward_flops"].values()))
    if model and micro_batch and seq:
        from slidedp.model_sizing import layer_forward_flops, shape_of
        from slidedp.presets import model_config_dict

        return float(sum(layer_forward_flops(shape_of(model_config_dict(model)), micro_batch, seq)))
    return None


def layer_report(rows: list[dict], first: int, calibration: dict | None = None,
                 flops: float | None = None) -> dict:
    """Per (direction, activations) the layer runs' medians (own and before, seconds) and the calibration's figure
    where given; per step the sums of both against the forward and backward spans. With `flops` (one layer's
    forward over one micro-batch, forward_flops) the medians and steps also get their TFLOP/s (_FORWARDS)."""
    run = next((r for r in rows if r["kind"] == "run"), {})
    unit = None
    if calibration is not None:
        unit = calibration.get("unit_compiled" if run.get("compiled") else "unit")
    layers = sorted((r for r in rows if r["kind"] == "layer" and r["step"] >= first),
                    key=lambda r: (r["step"], r["ready"]))
    gpu = {r["step"]: r for r in rows if r["kind"] == "gpu"}
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    steps: dict[int, dict[str, float]] = {}
    prev_end: dict[tuple[int, int, str], float] = {}
    for r in layers:
        own = r["end"] - r["ready"]
        key = (r["step"], r["mb"], r["dir"])
        before = r["ready"] - prev_end[key] if key in prev_end else None  # the first layer of a pass: no before
        prev_end[key] = r["end"]
        g = groups.setdefault((r["dir"], r["act"]), {"own": [], "before": []})
        g["own"].append(own)
        st = steps.setdefault(r["step"], {"forward_own": 0.0, "forward_before": 0.0, "backward_own": 0.0,
                                          "backward_before": 0.0, "model_forwards": 0, "work_forwards": 0})
        st[f"{r['dir']}_own"] += own
        model_fw, work_fw = _FORWARDS[(r["dir"], r["act"])]
        st["model_forwards"] += model_fw
        st["work_forwards"] += work_fw
        if before is not None:
            g["before"].append(before)
            st[f"{r['dir']}_before"] += before
    out: dict = {"compiled": run.get("compiled"), "kinds": [], "steps": []}
    for (direction, act), g in sorted(groups.items()):
        row = {"dir": direction, "act": act, "runs": len(g["own"]), "own_s": statistics.median(g["own"]),
               "before_s": statistics.median(g["before"]) if g["before"] else None}
        figure = (unit or {}).get(_CALIBRATED[(direction, act)])
        if figure:
            row.update(calibrated_s=figure, ratio=row["own_s"] / figure)
        if flops:
            model_fw, work_fw = _FORWARDS[(direction, act)]
            row.update(model_tflops=model_fw * flops / row["own_s"] / 1e12,
                       work_tflops=work_fw * flops / row["own_s"] / 1e12)
        out["kinds"].append(row)
    for s, st in sorted(steps.items()):
        g = gpu.get(s, {})
        if "forward_end" in g and "start" in g:
            st["forward_span"] = g["forward_end"] - g["start"]
        if "backward_end" in g and "forward_end" in g:
            st["backward_span"] = g["backward_end"] - g["forward_end"]
        model_fw, work_fw = st.pop("model_forwards"), st.pop("work_forwards")
        own = st["forward_own"] + st["backward_own"]
        if flops and own > 0:
            st.update(model_tflops=model_fw * flops / own / 1e12, work_tflops=work_fw * flops / own / 1e12)
        out["steps"].append({"step": s, **st})
    if flops and out["steps"]:
        out["median"] = {k: statistics.median(st[k] for st in out["steps"])
                         for k in ("model_tflops", "work_tflops") if all(k in st for st in out["steps"])}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline")
    ap.add_argument("--from-step", type=int, default=3, help="the first step counted (default 3: after warm-up)")
    ap.add_argument("--layers", action="store_true", help="where the compute stream's time went, layer by layer")
    ap.add_argument("--calibration", help="with --layers: the calibration JSON the run was planned with")
    ap.add_argument("--model", help="with --layers, for a timeline without layer_forward_flops: the run's model "
                    "(a preset or a local model directory)")
    ap.add_argument("--micro-batch", type=int, help="... and its micro-batch size")
    ap.add_argument("--seq", type=int, help="... and its sequence length")
    a = ap.parse_args(argv)
    if a.layers:
        calibration = None
        if a.calibration:
            with open(a.calibration, encoding="utf-8") as fh:
                calibration = json.load(fh)
        rows = load(a.timeline)
        flops = forward_flops(rows, a.model, a.micro_batch, a.seq)
        out = layer_report(rows, a.from_step, calibration, flops)
        for r in out["kinds"] + out["steps"] + ([{"median": out["median"]}] if "median" in out else []):
            print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}))
        return 0
    rows = report(load(a.timeline), a.from_step)
    for r in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if rows:
        keys = [k for k, v in rows[0].items() if isinstance(v, float)]
        print(json.dumps({"median": {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
