"""A readable plan: `slidedp plan` prints format_plan(plan_job(...)). Imports no torch."""

from __future__ import annotations

from typing import Any

from slidedp.planning.clip_cost import clipping_words
from slidedp.planning.plan import Candidate, Plan


def format_plan(plan: Plan | dict[str, Any]) -> str:
    """A readable summary: the chosen policy, its prediction, the candidates, why (or what does not fit). `plan`
    is the plan or its JSON (plan_job's answer)."""
    if not isinstance(plan, Plan):
        plan = Plan.from_dict(plan)
    lines = []
    declared = plan.declared
    if declared:  # a host described by a profile (planning/profiles.py), not this one
        lines.append(f"DECLARED HOST: {declared.get('profile')} ({declared.get('description')}), not this machine")
        lines.append("  every time below is predicted from the profile's declared figures, not measured here")
        lines.append("")
    if not plan.feasible:
        lines.append("NOT FEASIBLE")
        for e in plan.errors:
            lines.append(f"  {e['loc']}: {e['msg']}")
        if plan.ways_out:
            lines.append("")
            lines.append("ways out (each checked against the memory model):")
            lines.extend(f"  {w['summary']}" for w in plan.ways_out)
        lines.extend(format_card_sweep(plan.card_sweep or []))
        return "\n".join(lines)
    pol, pred = plan.policy, plan.predicted
    c = {p: pol["activations"].count(p) for p in ("keep", "offload", "checkpoint")}
    lines.append(
        f"policy: delivery={pol['delivery']} grad_reduce={pol['grad_reduce']} "
        f"edge_update={pol['edge_update']} device_layers={pol['device_layers']} "
        f"window={pol['window']} chunk_mb={pol['chunk_mb']} "
        f"loss_chunk_tokens={pol['loss_chunk_tokens']}"
        + (f" cast_scratch_mb={pol['cast_scratch_mb']}" if pol.get("cast_scratch_mb") else "")
    )
    lines.append(
        f"activations: keep {c['keep']}, offload {c['offload']}, checkpoint {c['checkpoint']}; "
        f"resident layers {sum(pol['resident'])}  ({_runs(pol['activations'])})"
    )
    mem = f"HBM peak {_gib(pred.hbm_peak_gib)}/GPU, " if pred.hbm_peak_gib is not None else ""
    lines.append(f"memory: {mem}host {_gib(pred.host_ram_gib)}")
    room = plan.headroom
    if room and room["fastest_free_fraction"] < room["margin_fraction"]:  # the rule decided (docs/planning.md)
        free = f"{room['chosen_free_fraction']:.0%} free"
        if room["outcome"].startswith("took"):
            lines.append(f"headroom: took a plan {max(room['slower_by_fraction'], 0.0):.1%} slower, {free} "
                         f"(the fastest left {room['fastest_free_fraction']:.1%}, under the "
                         f"{room['margin_fraction']:.0%} margin)")
        else:
            lines.append(f"headroom: kept the fastest, {room['chosen_free_fraction']:.1%} free: no plan within "
                         f"{room['max_slower_fraction']:.0%} of its step time keeps the {room['margin_fraction']:.0%} "
                         "margin")
    if pred.step_time_s is not None:
        lines.append(f"predicted: {pred.step_time_s:.3f} s/step, {pred.tokens_per_s:,.0f} tokens/s")
        lines.append("  phases: " + "  ".join(f"{k} {v:.3f}" for k, v in pred.phases.items()))
        if pred.exposed:
            lines.append("  exposed: " + "  ".join(f"{k} {v:.3f}" for k, v in pred.exposed.items()))
        hu = plan.host_update
        if hu and declared:
            lines.append(
                f"  host update: {hu['s_per_1e9']:.3f} s per 1e9 params at {hu['threads']} threads (derived from the "
                f"declared DRAM bandwidth, {hu['cpu_s_per_1e9']:.3f} x {hu['in_step_factor']:.2f} assumed beside the "
                "issuing thread)"
            )
        elif hu:
            lines.append(
                f"  host update: {hu['s_per_1e9']:.3f} s per 1e9 params at {hu['threads']} threads "
                f"(calibrated {hu['cpu_s_per_1e9']:.3f} x {hu['in_step_factor']:.2f} measured beside the issuing "
                "thread)"
            )
        b = pred.bound
        if b:
            lines.append(
                f"  bound: {b['step_time_s']:.3f} s/step ({b['binding']} binds; "
                + "  ".join(f"{k} {v:.3f}" for k, v in b["terms_s"].items())
                + f"; + {b['unhidden_s']:.3f} unhidden); the prediction is "
                f"{pred.step_time_s / b['step_time_s']:.2f}x the bound"
            )
    else:
        note = plan.calibration_note if plan.calibration_note is not None else "no calibration"
        lines.append(f"predicted: no step time ({note})")
    if plan.clipping is not None:  # where the update runs, where gradients wait, what clipping costs
        lines.append(clipping_words(plan.clipping))
    if plan.cast_scratch:  # the delivery cast through a scratch, and what it buys
        lines.append(cast_scratch_words(plan.cast_scratch))
    if plan.compiled_layers:  # compiled or eager layers, and why (planning/compiled_choice.py)
        lines.append(compiled_words(plan.compiled_layers))
    if plan.candidates:
        lines.append("")
        lines.append(
            f"{'delivery':<11}{'grad':<6}{'win':>4}{'chunk':>6}{'loss':>6}{'keep':>5}{'off':>4}{'res':>4}"
            f"{'step s':>9}{'tok/s':>9}{'HBM GiB':>9}{'host GiB':>9}  fits"
        )
        for cand in plan.candidates:
            p, q = cand.policy, cand.predicted
            t = f"{q.step_time_s:.3f}" if q.step_time_s is not None else "-"
            tps = f"{q.tokens_per_s:,.0f}" if q.tokens_per_s else "-"
            hbm = f"{q.hbm_peak_gib:.1f}" if q.hbm_peak_gib is not None else "-"
            lines.append(
                f"{p['delivery']:<11}{p['grad_reduce']:<6}{p['window']:>4}{p['chunk_mb']:>6}"
                f"{p['loss_chunk_tokens']:>6}{p['activations'].count('keep'):>5}"
                f"{p['activations'].count('offload'):>4}{sum(p['resident']):>4}{t:>9}{tps:>9}{hbm:>9}"
                f"{q.host_ram_gib:>9.1f}  {'yes' if cand.fits else 'no: ' + cand.why_not}"
            )
    lines.extend(format_card_sweep(plan.card_sweep or []))
    lines.append("")
    lines.append("why: " + plan.why)
    return "\n".join(lines)


def cast_scratch_words(choice: dict[str, Any]) -> str:
    """The plan's cast scratch (Plan.cast_scratch) in one sentence."""
    saved = choice["without_s"] - choice["step_time_s"]
    who = "as the job sets it" if choice["fixed"] else "taken by the planner"
    gain = f"{saved:.3f} s saved" if saved >= 0 else f"{-saved:.3f} s slower"
    return (f"cast scratch: {choice['mb']} MiB on each GPU ({who}), so the weights keep arriving while a cast waits "
            f"for the layer computing: {choice['step_time_s']:.3f} s a step against {choice['without_s']:.3f} s "
            f"without ({gain})")


def format_card_sweep(rows: list[dict[str, Any]]) -> list[str]:
    """The plan's card sweep as a small table, the job's own row marked with '*' (no lines without a sweep)."""
    if not rows:
        return []
    table = [("GPU memory per GPU", "step", "tokens/s", "fits", "policy")]
    for r in rows:
        size = f"{'* ' if r['current'] else '  '}{r['hbm_gib']:.1f} GiB" + (" (whole card)" if r["whole_card"] else "")
        step = f"{r['step_time_s']:.3f} s" if r.get("step_time_s") is not None else "-"
        tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
        table.append((size, step, tps, "yes" if r["fits"] else "no", r["policy"] if r["fits"] else r["why_not"]))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    out = ["", "what a different card would buy (* this job):"]
    for row in table:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].rjust(widths[2]), row[3].ljust(widths[3])]
        out.append(" | ".join([*cells, row[4] or ""]).rstrip())
    return out


def _gib(x: float) -> str:
    return f"{x:.1f} GiB" if x >= 0.1 else f"{x * 1024:.1f} MiB"


def _runs(acts: list[str]) -> str:
    """Layer ranges per policy, e.g. "1-27 keep, 28-36 checkpoint"."""
    out, start = [], 0
    for i in range(1, len(acts) + 1):
        if i == len(acts) or acts[i] != acts[start]:
            out.append(f"{start + 1}-{i} {acts[start]}" if i - start > 1 else f"{i} {acts[start]}")
            start = i
    return ", ".join(out)


def shortlist(cands: list[Candidate], n: int) -> list[Candidate]:
    """The n fastest, plus the fastest of every route and device-update choice beyond them (the plan shows
    what each choice would cost, not only variants of the winner)."""
    out = cands[:n]
    seen = {_variant(c) for c in out}
    for c in cands[n:]:
        if _variant(c) not in seen:
            seen.add(_variant(c))
            out.append(c)
    return out


def _variant(c: Candidate) -> tuple:
    p = c.policy
    return p["delivery"], p["grad_reduce"], p["edge_update"], p["device_layers"], c.fits


def compiled_words(c: dict[str, Any]) -> str:
    """The plan's compiled_layers in one line."""
    who = "configured" if c["by"] == "config" else "planner's choice"
    head = f"layers: {'compiled' if c['chosen'] else 'eager'} ({who}): {c['reason']}"
    if c["chosen"] and c.get("compile_s") is not None:
        head += f"; the ranks compile them at start (~{c['compile_s']:.0f} s, once, beside the host state's fill)"
    return head
