"""Read a step timeline (SLIDEDP_TRACE, slidedp/step/trace.py) and say where the host updater idled.

Usage: python scripts/trace_report.py TIMELINE.jsonl [--from-step 3]

Per step (from the end of one backward on the compute stream to the next), it prints the updater's busy and idle
seconds, the idle split into before the step's first gradient was in hand and between gradients, the unit the
updater finished last before the step's first gradient, and the time from that update to the forward's end.
Medians over the steps from --from-step on close the report.
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
    work = sorted((r for r in rows if r["kind"] in ("update", "hold", "final")), key=lambda r: r["t0"])
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
        before = [w for w in inside if w["step"] == s]
        last_before = max(before, key=lambda w: w["t1"]) if before else None
        last_t = last_before["t1"] if last_before else lo
        out.append({"step": s + 1, "period_s": hi - lo, "updater_busy_s": busy, "idle_s": (hi - lo) - busy,
                    "idle_before_first_gradient_s": max(0.0, first_in - last_t),
                    "last_unit_before": last_before["unit"] if last_before else None,
                    "forward_end_after_last_update_s": gpu[s + 1].get("forward_end", hi) - last_t,
                    "leftover_units": len(before)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline")
    ap.add_argument("--from-step", type=int, default=3, help="the first step counted (default 3: after warm-up)")
    a = ap.parse_args(argv)
    rows = report(load(a.timeline), a.from_step)
    for r in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if rows:
        keys = [k for k, v in rows[0].items() if isinstance(v, float)]
        print(json.dumps({"median": {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
