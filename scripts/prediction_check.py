"""Re-predict the measured benchmark rows of the one-H200 machine with today's planner, row by row and phase by phase.

    .venv/bin/python scripts/prediction_check.py                 # the rows used to study the model (development)
    .venv/bin/python scripts/prediction_check.py --set heldout   # the held-out rows (tests/runtime/test_prediction_heldout.py)
    .venv/bin/python scripts/prediction_check.py --set check     # rows measured after the split (s17, s18): checked only
    .venv/bin/python scripts/prediction_check.py --set all --json out.json
    .venv/bin/python scripts/prediction_check.py --set h100      # the H100 machines' rows (not in `all`)
    .venv/bin/python scripts/prediction_check.py --set h100 --host-scale 1.1   # as if the host's memory work took 1.1x
    .venv/bin/python scripts/prediction_check.py --set h100 --observed   # each row priced with earlier rows' host factor
    .venv/bin/python scripts/prediction_check.py --write-fixture tests/runtime/fixtures/h200x1_heldout_steps.json

Every `slidedp bench` row under docs/results/ that ran SlideDP on the one-GPU machine (nvidia-h200: 1 x H200, 16
cores, 128 GiB) and recorded its planner's prediction is planned again: the job as the row ran it (model, micro-batch,
sequence, clipping, GPU memory cap), the policy the run resolved to (its `chosen`: route, window, cast, edge and
device updates, kept / offloaded / resident layer counts, the staging slots its policy string fixed), the machine's
topology (tests/runtime/fixtures/h200x1_qwen3-1.7b.json) and the calibration measured in that session (the row's
folder's `calibration/` of the row's shape). Sessions that kept no calibration of their shape (s11, s13-s16: the
Qwen3-4B micro-batch-4 rows) are planned with the last earlier calibration of that shape (s10), and say so.

The split, fixed before the model was changed: the held-out rows are those of sessions s7, s9 and s12 (each with its
own calibration: Qwen3-1.7B at micro-batch 4 and 8, Qwen3-4B at 8, Qwen3-8B at 1 under 24 GiB with the cast on the
GPU); every other row is for development. The held-out rows are not read while the model is changed.

The check rows (`--set check`): sessions measured on the same machine after that split (s17, s18: the clipped step,
the streamed update; s19: Qwen3-8B micro-batch 8 whole-card steps with their own calibration; s20, s21: compiled layers, sustained-clock
calibrations, s21 with the streamed layers' weights kept on the GPU), reported beside the
others and fitted to nothing. s18 kept no calibration; its rows are
planned with the newest earlier session's calibration of their shape (Qwen3-4B micro-batch 4: s17; Qwen3-8B
micro-batch 8: s8), and say so.

The H100 rows (`--set h100`): sessions run on machines of the kind nvidia-h100-x1 (1 x H100 80 GB, 16 cores, 128 GiB;
the host behind it differed from run to run), each planned with its own session's calibration of its shape (no
stand-in) and the topology one of them detected (docs/results/s25/topology.json). Another machine kind: reported
apart, never mixed into the H200 sets.

Per row: measured and predicted step, the error, and the step cut as the engine measures it (forward: step start to
the end of the first micro-batch's forward; backward: the rest) with the host updater's busy time, measured against
predicted.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
TOPOLOGY = os.path.join(ROOT, "tests", "runtime", "fixtures", "h200x1_qwen3-1.7b.json")
HELD_OUT_SESSIONS = ("s7", "s9", "s12")
ONE_GPU_SESSIONS = ("s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14", "s15", "s16")
STAND_IN = "s10"  # the last calibration of Qwen3-4B at micro-batch 4 kept on the one-GPU machine
CHECK_SESSIONS = ("s17", "s18", "s19", "s20", "s21")  # measured after the held-out split: checked, never fitted to
# Sessions whose engine delivered streamed layers from the host after their update, before their updated weights
# stayed on the GPU for the next forward (slidedp.step.streamed_update): planned as that engine ran.
BEFORE_KEPT_WEIGHTS = ONE_GPU_SESSIONS + ("s17", "s18", "s19", "s20")
# Sessions whose engine ran a clipped step's update after the norm in one pass per unit, before the weights pass and
# the moments pass (slidedp.step.optimizer.Updater._post_norm): planned as that engine ran.
BEFORE_TWO_PASSES = BEFORE_KEPT_WEIGHTS + ("s21",)
# Sessions whose engine streamed the last `streamed_layers` layers, before they followed the device layers
# (slidedp.schedule.streamed_units): every session checked here.
BEFORE_EARLY_STREAMED = BEFORE_TWO_PASSES + ("s22",)


def before_bf16_device_gradients(session: str) -> bool:
    """Whether the session's engine kept a device-updated layer's gradient in fp32 (before it waited in bf16 where
    exact, slidedp.step.device_update): every session up to s39."""
    return session.startswith("s") and session[1:].isdigit() and int(session[1:]) < 40


# Sessions on machines of the kind nvidia-h100-x1, and the topology one of them detected
H100_SESSIONS = ("s22", "s23", "s25", "s26", "s27", "s28", "s29", "s30", "s31", "s32", "s33", "s36", "s37", "s38", "s39", "s40", "s41")
H100_TOPOLOGY = os.path.join(RESULTS, "s25", "topology.json")

sys.path.insert(0, os.path.join(ROOT, "runtime"))


def session_of(path: str) -> str:
    return os.path.relpath(path, RESULTS).split(os.sep)[0]


def calibrations_of(folder: str) -> list[tuple[str, dict]]:
    out = []
    for f in sorted(glob.glob(os.path.join(folder, "calibration", "*.json"))):
        with open(f) as fh:
            out.append((os.path.relpath(f, RESULTS), json.load(fh)))
    return out


def calibration_for(row: dict, path: str) -> tuple[str, dict, bool] | None:
    """(where from, calibration, stand-in?) of the row's shape: its session's nearest to the row, else the stand-in
    session's."""
    want = (row["mbs"], row["seq"], _hidden(row["model"]))
    own = [os.path.dirname(path)]  # the row's folder, then the folders above it up to its session's
    while os.path.relpath(own[-1], RESULTS) != session_of(path):
        own.append(os.path.dirname(own[-1]))
    places = [(f, False) for f in own] + [(os.path.join(RESULTS, STAND_IN), True)]
    if session_of(path) in H100_SESSIONS:  # another machine: its own session's calibration or none
        places = [(f, False) for f in own]
    elif session_of(path) in CHECK_SESSIONS:  # the newest earlier one-GPU session's calibration of the shape
        n = int(session_of(path)[1:])
        earlier = [s for s in (*ONE_GPU_SESSIONS, *CHECK_SESSIONS) if int(s[1:]) < n]
        places = [(f, False) for f in own] + [
            (d, True) for s in sorted(earlier, key=lambda s: -int(s[1:]))
            for d in sorted(glob.glob(os.path.join(RESULTS, s, "**", ""), recursive=True))]
    for where, stand_in in places:
        for name, cal in calibrations_of(where):
            s = cal.get("shape") or {}
            if (s.get("micro_batch"), s.get("seq"), s.get("hidden")) == want and cal.get("world") == 1:
                return name, cal, stand_in
    return None


def _hidden(model: str) -> int | None:
    return {"qwen3-1.7b": 2048, "qwen3-4b": 2560, "qwen3-8b": 4096, "llama3.2-3b": 3072}.get(model)


def set_of(session: str) -> str | None:
    """The --set a session's rows belong to (`all` is every H200 set, not h100), None for a session of neither."""
    if session in H100_SESSIONS:
        return "h100"
    if session in HELD_OUT_SESSIONS:
        return "heldout"
    if session in CHECK_SESSIONS:
        return "check"
    return "dev" if session in ONE_GPU_SESSIONS else None


def measured_rows(which: str) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "**", "*.jsonl"), recursive=True)):
        kind = set_of(session_of(path))
        if kind is None or which not in (kind, "all") or (which == "all" and kind == "h100"):
            continue
        with open(path) as fh:
            for i, line in enumerate(fh):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("peer") or not r.get("step_s") or not r.get("predicted_step_s") or not r.get("chosen"):
                    continue
                if r.get("gpus") != 1 or _hidden(r.get("model", "")) is None:
                    continue
                rows.append({"source": f"{os.path.relpath(path, RESULTS)}:{i}", "path": path, **r})
    return rows


def job_config(row: dict) -> dict:
    """The job the row ran, its policy pinned to what the run resolved (the loss chunk and, unless the policy string
    fixed them, the staging slots left to the planner, as they were)."""
    from slidedp.policy import parse_shorthand

    request, clip = parse_shorthand(row["policy"])
    ch = row["chosen"]
    policy = {
        "delivery": ch["delivery"], "grad_reduce": ch["grad_reduce"], "window": ch["window"],
        "delivery_cast": ch.get("delivery_cast", "host"), "edge_update": ch.get("edge_update", "host"),
        "device_layers": ch.get("device_layers", 0), "activations": "auto", "keep_layers": ch["keep_layers"],
        "offload_layers": ch["offload_layers"], "resident_units": ch["resident_layers"],
        "staging_slots": request.staging_slots, "streamed_layers": ch.get("streamed_layers", 0),
        # as run: `chosen` records it; rows from before it did show it by the ranks' compile at start
        "compiled_layers": bool(ch.get("compiled_layers") or "compile_layers" in (row.get("rank_startup_s") or {})),
        # as run: one pass before BEFORE_TWO_PASSES ended, else as `chosen` records it
        "post_norm_passes": 1 if session_of(row["path"]) in BEFORE_TWO_PASSES else ch.get("post_norm_passes", 1),
        "cast_scratch_mb": ch.get("cast_scratch_mb", 0),  # as run: rows from before it was recorded had none
    }
    cfg = {"model": row["model"], "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": row["mbs"],
           "seq_len": row["seq"], "cpu_threads": 16, "precision": "bf16",
           "optimizer": {"max_grad_norm": clip}, "policy": policy}
    if row.get("gpu_memory_gib"):
        cfg["gpu_memory_gib"] = row["gpu_memory_gib"]
    return cfg


def last_layers_streamed(layers: int, device_layers: int, streamed_layers: int) -> frozenset[int]:
    """The streamed layers as the engine chose them before BEFORE_EARLY_STREAMED ended: the last ones."""
    n = min(int(streamed_layers or 0), layers - min(int(device_layers or 0), layers))
    return frozenset(range(layers - n + 1, layers + 1))


def engine_as_run(session: str):
    """A context in which the planner prices the engine as it ran in `session` (BEFORE_KEPT_WEIGHTS: streamed
    layers delivered from the host; BEFORE_EARLY_STREAMED: the last layers streamed; before_bf16_device_gradients:
    device layers' gradients in fp32), or today's. (The post-norm update's passes are a policy field: job_config
    sets them as the row ran.)"""
    import contextlib
    from unittest import mock

    from slidedp import policy
    from slidedp.planning import cost_model, memory_model

    stack = contextlib.ExitStack()
    if session in BEFORE_EARLY_STREAMED:
        stack.enter_context(mock.patch.object(policy, "streamed_units", last_layers_streamed))
    if session in BEFORE_KEPT_WEIGHTS:
        stack.enter_context(mock.patch.object(cost_model, "streamed_weights_stay", lambda world, delivery: False))
    if before_bf16_device_gradients(session):
        stack.enter_context(mock.patch.object(memory_model, "device_gradients_bf16", lambda job: set()))
    return stack


def repredict(row: dict, topology: dict, observed: dict[tuple[str, bool], list[float]] | None = None) -> dict:
    """The row planned again. `observed`: the host factors earlier rows observed, per (calibration, clipping), as a
    run leaves them in its calibration (slidedp.planning.observed): the row's host update is charged at the median
    of the last ones of its calibration and clipping (host_scaled, update_only), and its own factor, against the calibration's
    seconds, is added after it."""
    from slidedp.config import JobConfig
    from slidedp.planning import autopolicy as ap
    from slidedp.planning.observed import FACTOR_RANGE, OBSERVATIONS_KEPT

    found = calibration_for(row, row["path"])
    if found is None:
        return {"source": row["source"], "skipped": "no calibration of its shape"}
    cal_name, cal, stand_in = found
    key = (cal_name, bool(row.get("clipped")))
    earlier = (observed or {}).get(key, [])[-OBSERVATIONS_KEPT:]
    host_factor = statistics.median(earlier) if earlier else 1.0
    with engine_as_run(session_of(row["path"])), host_scaled(host_factor, update_only=True):
        plan = ap.plan_job(JobConfig.from_dict(job_config(row)), topology, cal)
    pred = plan.get("predicted") or {}
    if not plan.get("feasible") or not pred.get("step_time_s"):
        return {"source": row["source"], "skipped": f"planned infeasible: {plan.get('errors')}"}
    ph = row.get("phases") or {}
    spans = pred.get("spans") or {}
    busy = pred.get("busy") or {}
    if observed is not None and ph.get("update_busy") and busy.get("cpu"):
        factor = ph["update_busy"] / busy["cpu"] * host_factor
        if FACTOR_RANGE[0] <= factor <= FACTOR_RANGE[1]:
            observed.setdefault(key, []).append(factor)
    return {
        "source": row["source"], "model": row["model"], "mbs": row["mbs"], "cap": row.get("gpu_memory_gib"),
        "clip": bool(row.get("clipped")), "policy": row["policy"], "calibration": cal_name, "stand_in": stand_in,
        "measured_s": row["step_s"], "recorded_prediction_s": row["predicted_step_s"],
        "predicted_s": pred["step_time_s"], "error": pred["step_time_s"] / row["step_s"] - 1,
        "bound_s": (pred.get("bound") or {}).get("step_time_s"),
        "phases": {
            "forward": (ph.get("forward"), spans.get("forward")),
            "backward": (ph.get("backward"), spans.get("backward")),
            "update_busy": (ph.get("update_busy"), busy.get("cpu")),
            "update_tail": (ph.get("update_tail"), (pred.get("phases") or {}).get("update_tail")),
        },
        "plan_policy": plan.get("policy"),
        "host_factor": host_factor,
    }


@contextlib.contextmanager
def host_scaled(k: float, update_only: bool = False):
    """Price every row as if the host's memory work took k times its calibrated time: the host update, the host's
    copies and host memory's capacity (divided by k). A question asked of the rows (would a slower or faster host
    explain the misses?), not a term of the model. update_only: the host update alone (the replay of the host
    factors runs keep, --observed: the busy time a run measures already holds what sharing host memory cost its
    updater, so copies and capacity stay as calibrated)."""
    from slidedp.planning import cost_model

    rates = cost_model.Rates
    update_s, copy_s, pools = rates.update_s, rates.copy_s, rates.pools

    def scaled_pools(self):
        dram, link = pools(self)
        return (dram / k if dram else dram), link

    if k != 1.0:
        rates.update_s = lambda self, *a, **kw: update_s(self, *a, **kw) * k
        if not update_only:
            rates.copy_s = lambda self, *a, **kw: copy_s(self, *a, **kw) * k
            rates.pools = scaled_pools
    try:
        yield
    finally:
        rates.update_s, rates.copy_s, rates.pools = update_s, copy_s, pools


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def table(results: list[dict]) -> str:
    head = (f"{'row':34s} {'model':10s} {'mbs':>3s} {'cap':>4s} {'clip':>4s} {'meas':>6s} {'pred':>6s} {'err':>7s} "
            f"{'bound':>6s} | fwd m/p        bwd m/p        upd-busy m/p   tail m/p")
    lines = [head, "-" * len(head)]
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['source']:34s} skipped: {r['skipped']}")
            continue
        ph = " ".join(f"{_f(m)}/{_f(p)}  " for m, p in r["phases"].values())
        mark = "*" if r["stand_in"] else " "
        lines.append(
            f"{r['source']:34s} {r['model']:10s} {r['mbs']:3d} {_f(r['cap'], '{:.0f}'):>4s} "
            f"{'y' if r['clip'] else '-':>4s} {r['measured_s']:6.3f} {r['predicted_s']:6.3f} "
            f"{r['error'] * 100:+6.1f}%{mark} {_f(r['bound_s']):>6s} | {ph}")
    ok = [r for r in results if "error" in r]
    if ok:
        errs = [abs(r["error"]) for r in ok]
        within = sum(e <= 0.10 for e in errs)
        bias = sum(r["error"] for r in ok) / len(ok)  # the signed mean: which way the model leans
        lines.append(f"\n{len(ok)} rows: mean |error| {100 * sum(errs) / len(errs):.1f}%, mean error {100 * bias:+.1f}%, "
                     f"max {100 * max(errs):.1f}%, within ±10%: {within}, within ±5%: {sum(e <= 0.05 for e in errs)}"
                     "   (* planned with the stand-in calibration)")
    return "\n".join(lines)


def write_fixture(path: str) -> None:
    """The held-out rows as the test reads them (tests/runtime/test_prediction_heldout.py): for each row its source,
    the job config it is planned with (job_config), the measured step and the calibration it ran with, and each
    calibration once, under its path in docs/results."""
    rows, cals = [], {}
    for row in measured_rows("heldout"):
        found = calibration_for(row, row["path"])
        if found is None or found[2]:
            continue
        name, cal, _ = found
        cals[name] = cal
        rows.append({"source": f"docs/results/{row['source']}", "policy": row["policy"], "chosen": row["chosen"],
                     "config": job_config(row), "calibration": name, "measured_step_s": row["step_s"],
                     "recorded_prediction_s": row["predicted_step_s"]})
    about = ("Measured steps of the one-GPU machine (nvidia-h200: 1 x H200, 16 cores, 128 GiB) held out from the "
             "work on the step-time model: every SlideDP row of docs/results sessions " + ", ".join(HELD_OUT_SESSIONS)
             + " (`slidedp bench`, median step after warm-up), with the job config it is planned with (the policy "
             "the run resolved to, from the row's `chosen`), its measured step and the calibration measured in that "
             "session (docs/results/<session>/.../calibration). Written by scripts/prediction_check.py "
             "--write-fixture; the topology is h200x1_qwen3-1.7b.json's.")
    with open(path, "w") as fh:
        json.dump({"about": about, "rows": rows, "calibrations": cals}, fh, indent=1)
        fh.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("dev", "heldout", "check", "all", "h100"), default="dev")
    ap.add_argument("--json", help="write the per-row results here")
    ap.add_argument("--write-fixture", metavar="PATH", help="write the held-out rows as the test reads them, and stop")
    ap.add_argument("--host-scale", type=float, default=1.0, metavar="K",
                    help="price the host's memory work (update, copies, host memory's capacity) at K times its "
                         "calibrated time: how the rows would read on a host K times slower")
    ap.add_argument("--observed", action="store_true",
                    help="plan each row with its host update charged at the median host factor the earlier rows "
                         "of its calibration and clipping observed (measured over planned updater busy time), as "
                         "runs keep them (slidedp.planning.observed), and say how the rows that had some read")
    args = ap.parse_args()
    if args.write_fixture:
        write_fixture(args.write_fixture)
        return
    if args.set == "h100":
        with open(H100_TOPOLOGY) as fh:
            topology = json.load(fh)
    else:
        with open(TOPOLOGY) as fh:
            topology = json.load(fh)["topology"]
    observed: dict | None = {} if args.observed else None  # the product keeps these but prices nothing with them
    with host_scaled(args.host_scale):
        results = [repredict(r, topology, observed) for r in measured_rows(args.set)]
    print(table(results))
    if args.observed:
        acted = [r for r in results if "error" in r and r["host_factor"] != 1.0]
        if acted:
            errs = [r["error"] for r in acted]
            print(f"{len(acted)} rows planned with earlier rows' host factor: mean error {100 * sum(errs) / len(errs):+.1f}%, "
                  f"mean |error| {100 * sum(map(abs, errs)) / len(errs):.1f}%, within ±5%: "
                  f"{sum(abs(e) <= 0.05 for e in errs)}, within ±10%: {sum(abs(e) <= 0.10 for e in errs)}; sources: "
                  + " ".join(r["source"] for r in acted))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
