#!/usr/bin/env python3
"""The current benchmark results, from the raw `slidedp bench` rows: a Markdown table and a figure.

    .venv/bin/python scripts/bench_report.py            # print the table; write docs/img/benchmarks.png
    .venv/bin/python scripts/bench_report.py --write    # also put the table into docs/benchmarks.md
    .venv/bin/python scripts/bench_report.py --check    # exit 1 if docs/benchmarks.md's table is not this one

Which rows are shown is declared in docs/results/scenarios.json: per scenario, the result file (JSON lines of
docs/interfaces.md §9), the SlideDP row (by its policy string), the peer rows (by their spec), the calibration the
run planned with (its `created_at` is the date shown, unless the scenario gives the run's own `date`; a run whose
calibration stayed on the machine gives its `date` and the model's `layers` instead), the machine kind and the
command as it ran. Every figure comes from the rows: step s is the row's `step_s` (median step after
the warm-up), tokens/s is the tokens of one step (GPUs × micro-batch × seq) over it, peak HBM is `hbm_peak_gib`,
"SlideDP vs this" is this row's step time over SlideDP's (SlideDP's tokens/s over this row's), and first step s is
the row's `time_to_first_step_s` (from the train() call to the first step's record; rows from before it was
recorded show –). A run under `--gpu-memory-gib N` shows `under N GiB` beside its GPU count. The command is
checked against the rows: its model, GPUs, micro-batch, seq, data and GPU memory cap, its `--policies` and
`--peers` in the order the file holds them, and the steps, threads and learning rate the peer rows record.

The table goes into docs/benchmarks.md between `<!-- current-results:begin -->` and `<!-- current-results:end -->`.
The figure (matplotlib, Agg) has a fixed size, resolution and fonts, and no date or version in its metadata, so
the same rows and the same matplotlib give the same file.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# which layers a row streamed after the norm: the sessions whose engine streamed the last ones, as prediction_check
# prices them, and today's positions (prediction_check puts the runtime on the path; slidedp.schedule imports no torch)
sys.path.insert(0, str(REPO / "scripts"))
from prediction_check import BEFORE_EARLY_STREAMED  # noqa: E402
from slidedp.schedule import streamed_units  # noqa: E402

RESULTS = REPO / "docs" / "results"
SCENARIOS = RESULTS / "scenarios.json"
DOC = REPO / "docs" / "benchmarks.md"
PNG = REPO / "docs" / "img" / "benchmarks.png"
BEGIN = "<!-- current-results:begin -->"
END = "<!-- current-results:end -->"

# `slidedp bench`'s defaults for the flags a command may leave out (slidedp.bench.main)
BENCH_DEFAULTS = {"--data": "random", "--lr": "1e-5", "--warmup": "2"}

# the figure's colour and short name per kind of system
STYLE = {
    "slidedp": ("SlideDP", "#2b6cb0"),
    "fsdp2": ("FSDP2\nGPU-resident", "#dd8a2e"),
    "fsdp2-offload": ("FSDP2 +\nCPUOffload", "#805ad5"),
    "ds-zero2": ("DeepSpeed\nZeRO-2 offload", "#5a8f3c"),
    "ds-zero3": ("DeepSpeed\nZeRO-3 offload", "#2f6f4f"),
}


class ReportError(Exception):
    """A scenario that does not match its rows."""


def model_name(preset: str) -> str:
    """qwen3-8b -> Qwen3-8B."""
    family, _, size = preset.partition("-")
    return f"{family[:1].upper()}{family[1:]}-{size.upper()}" if size else preset


def read_rows(results: Path, rel: str) -> list[dict]:
    path = results / rel
    if not path.is_file():
        raise ReportError(f"{rel}: no such result file under {results}")
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def one_row(rows: list[dict], policy: str, rel: str) -> dict:
    found = [r for r in rows if r.get("policy") == policy]
    if len(found) != 1:
        raise ReportError(f"{rel}: {len(found)} rows with policy {policy!r} (expected exactly one)")
    row = found[0]
    if "error" in row or row.get("step_s") is None:
        raise ReportError(f"{rel}: the row {policy!r} holds no measurement ({row.get('error', 'no step_s')})")
    return row


def parse_command(command: str) -> dict[str, str]:
    """`[VAR=value ...] slidedp bench --flag value ...` -> {flag: value}."""
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    if words[:2] != ["slidedp", "bench"]:
        raise ReportError(f"command {command!r}: expected `slidedp bench ...`")
    flags = words[2:]
    if len(flags) % 2 or not all(f.startswith("--") for f in flags[::2]):
        raise ReportError(f"command {command!r}: expected --flag value pairs after `slidedp bench`")
    return dict(zip(flags[::2], flags[1::2]))


def check_command(command: str, rows: list[dict], rel: str) -> None:
    """The command must be the one that wrote these rows (as far as the rows record it)."""
    opts = {**BENCH_DEFAULTS, **parse_command(command)}
    for flag in ("--model", "--seq", "--gpus", "--mbs", "--steps", "--threads", "--policies"):
        if flag not in opts:
            raise ReportError(f"{rel}: the command does not state {flag}")
    want = {"model": opts["--model"], "seq": int(opts["--seq"]), "gpus": int(opts["--gpus"]),
            "mbs": int(opts["--mbs"]), "data": opts["--data"],
            "gpu_memory_gib": float(opts["--gpu-memory-gib"]) if "--gpu-memory-gib" in opts else None}
    for r in rows:
        for key, value in want.items():
            if key in r and r[key] != value:
                raise ReportError(f"{rel}: row {r.get('policy')!r} has {key}={r[key]!r}, the command {value!r}")
    policies = [r["policy"] for r in rows if "peer" not in r]
    peers = [r["policy"] for r in rows if "peer" in r]
    if opts["--policies"].split(",") != policies:
        raise ReportError(f"{rel}: the command's --policies are not the file's SlideDP rows {policies}")
    if (opts["--peers"].split(",") if "--peers" in opts else []) != peers:
        raise ReportError(f"{rel}: the command's --peers are not the file's peer rows {peers}")
    for r in rows:
        if "peer" not in r or "error" in r:
            continue
        recorded = {"--steps": r.get("steps"), "--threads": r.get("threads"), "--warmup": r.get("warmup"),
                    "--lr": r.get("lr")}
        for flag, value in recorded.items():
            if value is not None and float(opts[flag]) != float(value):
                raise ReportError(f"{rel}: peer {r['policy']!r} ran with {flag} {value}, the command says "
                                  f"{opts[flag]}")


def calibration(results: Path, rel: str, row: dict) -> dict:
    """The calibration the run planned with; it must be for this model, batch and GPU count."""
    path = results / rel
    if not path.is_file():
        raise ReportError(f"{rel}: no such calibration file under {results}")
    cal = json.loads(path.read_text(encoding="utf-8"))
    shape = cal.get("shape", {})
    if (shape.get("model"), shape.get("micro_batch"), cal.get("world")) != (row["model"], row["mbs"], row["gpus"]):
        raise ReportError(f"{rel}: calibrated for {shape.get('model')} micro-batch {shape.get('micro_batch')} on "
                          f"{cal.get('world')} GPU(s), not {row['model']} micro-batch {row['mbs']} on {row['gpus']}")
    return cal


def clip_of(row: dict) -> float:
    if "peer" in row:
        return float(row.get("max_grad_norm") or 0.0)
    parts = row["policy"].split(":")
    return float(parts[3]) if len(parts) > 3 and parts[3] != "auto" else 0.0


def slidedp_label(row: dict, layers: int | None, session: str | None = None) -> str:
    """What the SlideDP row ran, from its policy string and `chosen` (the policy as run); `layers`: the model's;
    `session`: the results folder the row is from (which layers it streamed)."""
    chosen = row.get("chosen") or {}
    parts = []
    if row["gpus"] > 1:
        parts.append(f"{chosen.get('delivery', '?')} delivery, {chosen.get('grad_reduce', '?').upper()} reduce")
    edge, on_gpu = chosen.get("edge_update", "host"), int(chosen.get("device_layers") or 0)
    layers_on_gpu = f"{on_gpu} layer{'s' if on_gpu != 1 else ''}"
    if edge == "gpu":
        parts.append(f"embedding/head + {layers_on_gpu} updated on the GPU" if on_gpu
                     else "embedding/head updated on the GPU")
    elif on_gpu:
        parts.append(f"{layers_on_gpu} updated on the GPU, embedding/head on the host")
    else:
        parts.append("every unit updated on the host")
    keep = int(chosen.get("keep_layers") or 0)
    parts.append("every layer keeps activations" if keep and keep == layers
                 else f"first {keep} layers keep activations" if keep else "every layer checkpointed")
    streamed = int(chosen.get("streamed_layers") or 0)
    if streamed:
        fields = row["policy"].split(":")
        asked = " (as asked)" if len(fields) > 9 and fields[9].isdigit() else ""
        if session in BEFORE_EARLY_STREAMED:
            parts.append(f"last {streamed} layers' update after the norm streamed through the GPU{asked}")
        else:
            units = sorted(streamed_units(layers or on_gpu + streamed, on_gpu, streamed))
            which = f"layer {units[0]}" if len(units) == 1 else f"layers {units[0]}-{units[-1]}"
            parts.append(f"the update of {which} after the norm streamed through the GPU{asked}")
    if chosen.get("delivery_cast") == "gpu":
        parts.append("fp32 master cast on the GPU")
    # compiled layers: as run (`chosen`), or, in rows from before it was recorded there, the ranks' compile
    if chosen.get("compiled_layers") or "compile_layers" in (row.get("rank_startup_s") or {}):
        parts.append("compiled layers")
    if clip_of(row):
        parts.append(f"clipping at {clip_of(row)}")
    auto = " AutoPolicy" if row["policy"].startswith("auto") else ""
    return f"**SlideDP**{auto}: " + ", ".join(parts)


def peer_label(row: dict) -> str:
    peer, keep = row["peer"], row.get("keep_layers")
    if peer.startswith("fsdp2"):
        name = "FSDP2 + CPUOffloadPolicy" if peer == "fsdp2-offload" else "FSDP2 GPU-resident"
        acts = ("no checkpointing" if keep is None else "every layer checkpointed" if keep == 0
                else f"first {keep} layers not checkpointed")
        parts = [name, acts] + (["compiled layers"] if row.get("compiled_layers") else [])
        if peer == "fsdp2-offload":
            parts.insert(1, f"fused CPU AdamW ({row.get('threads')} threads)")
    elif peer.startswith("ds-zero"):
        what = {"optimizer": "optimizer", "optimizer+parameters": "optimizer and parameters"}.get(
            row.get("offload"), str(row.get("offload")))
        parts = [f"DeepSpeed ZeRO-{peer[-1]}", f"{what} offloaded to the CPU"]
    else:
        parts = [peer]
    if clip_of(row):
        parts.append(f"clipping at {clip_of(row)}")
    return ", ".join(parts)


def resolve(scenario: dict, results: Path) -> dict:
    """One scenario's figures, SlideDP first, then the peers in the declared order."""
    rel = scenario["results"]
    rows = read_rows(results, rel)
    check_command(scenario["command"], rows, rel)
    base = one_row(rows, scenario["slidedp"], rel)
    # a run whose calibration stayed on the machine names the model's layer count and its date instead
    cal = calibration(results, scenario["calibration"], base) if scenario.get("calibration") else \
        {"shape": {"layers": scenario["layers"]}}
    picked = [base] + [one_row(rows, spec, rel) for spec in scenario["peers"]]
    tokens = base["gpus"] * base["mbs"] * base["seq"]
    systems = []
    for row in picked:
        kind = row.get("peer", "slidedp")
        systems.append({
            "kind": kind,
            "label": peer_label(row) if "peer" in row else slidedp_label(row, cal.get("shape", {}).get("layers"),
                                                                      rel.split("/")[0]),
            "step_s": row["step_s"],
            "tokens_per_s": tokens / row["step_s"],
            "hbm_gib": row["hbm_peak_gib"],
            "vs": row["step_s"] / base["step_s"],  # SlideDP's tokens/s over this row's
            "first_step_s": row.get("time_to_first_step_s"),  # from the call to the first step (SlideDP rows)
        })
    return {"model": base["model"], "gpus": base["gpus"], "mbs": base["mbs"], "seq": base["seq"],
            "data": base.get("data", "random"), "clip": clip_of(base), "machine": scenario["machine"],
            "cap": base.get("gpu_memory_gib"), "date": scenario.get("date") or str(cal["created_at"])[:10],
            "results": rel,
            "command": scenario["command"], "note": scenario.get("note", ""), "systems": systems}


def load(scenarios: Path = SCENARIOS, results: Path = RESULTS) -> tuple[list[dict], dict]:
    spec = json.loads(scenarios.read_text(encoding="utf-8"))
    return [resolve(s, results) for s in spec["scenarios"]], spec.get("machines", {})


def setting(s: dict) -> str:
    """seq 2048[, pattern data][, clipping at 1.0]"""
    return (f"seq {s['seq']}" + (", pattern data" if s["data"] == "pattern" else "")
            + (f", clipping at {s['clip']}" if s["clip"] else ""))


def cap_text(s: dict) -> str:
    """` under 24 GiB` for a run under a `--gpu-memory-gib` cap, else nothing."""
    return f" under {s['cap']:g} GiB" if s.get("cap") else ""


def gpus_text(s: dict) -> str:
    """1, or `1 under 24 GiB`."""
    return str(s["gpus"]) + cap_text(s)


def title(s: dict) -> str:
    gpus = f"{s['gpus']} GPU" + ("s" if s["gpus"] > 1 else "") + cap_text(s)
    return f"{model_name(s['model'])}, {gpus}, micro-batch {s['mbs']}"


def markdown(scenarios: list[dict], machines: dict) -> str:
    out = [
        "<!-- made by scripts/bench_report.py from docs/results/scenarios.json and the rows it names; "
        "edit those, not this -->",
        "",
        "| model | GPUs | micro-batch | seq | system | step s | tokens/s | peak HBM GiB | SlideDP vs this "
        "| first step s | machine | date | result file |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scenarios:
        for i, sy in enumerate(s["systems"]):
            head = [model_name(s["model"]), gpus_text(s), str(s["mbs"]), str(s["seq"])] if i == 0 else [""] * 4
            tail = ([f"`{s['machine']}`", s["date"], f"[`{s['results']}`](results/{s['results']})"] if i == 0
                    else [""] * 3)
            vs = "–" if sy["kind"] == "slidedp" else f"{sy['vs']:.2f}×"
            first = "–" if sy.get("first_step_s") is None else f"{sy['first_step_s']:.1f}"
            out.append("| " + " | ".join(head + [
                sy["label"], f"{sy['step_s']:.3f}", f"{sy['tokens_per_s']:,.0f}", f"{sy['hbm_gib']:.1f}", vs, first,
            ] + tail) + " |")
    out += ["", "Machines: " + "; ".join(f"`{k}`: {v}" for k, v in machines.items()) + ".", "",
            "Commands (each wrote its result file with `--out FILE`; on the 2-GPU machine with the variables "
            "`scripts/gpu_run.sh` sets):", ""]
    for s in scenarios:
        note = f" {s['note'][:1].upper()}{s['note'][1:]}." if s["note"] else ""
        out.append(f"- {title(s)}, {setting(s)} ({s['date']}, `{s['results']}`):{note}")
        out += ["  ```bash", f"  {s['command']}", "  ```"]
    return "\n".join(out) + "\n"


def plot(scenarios: list[dict], path: Path) -> None:
    """Tokens/s of SlideDP and each peer, one panel per scenario (own scale), SlideDP's ratio over each peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 9.5,
                         "svg.hashsalt": "slidedp", "path.simplify": False})
    cols = 4
    rows = (len(scenarios) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 4.4 * rows + 0.9), dpi=100, squeeze=False)
    for ax in axes.flat[len(scenarios):]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, scenarios):
        systems = s["systems"]
        xs = range(len(systems))
        values = [sy["tokens_per_s"] for sy in systems]
        ax.bar(xs, values, width=0.62, color=[STYLE[sy["kind"]][1] for sy in systems])
        top = max(values)
        ax.set_ylim(0, top * 1.36)
        for x, sy in zip(xs, systems):
            ax.text(x, sy["tokens_per_s"] + top * 0.02, f"{sy['tokens_per_s']:,.0f}", ha="center", va="bottom",
                    fontsize=8.5)
            if sy["kind"] != "slidedp":
                ax.text(x, sy["tokens_per_s"] + top * 0.09, f"SlideDP\n{sy['vs']:.2f}×", ha="center", va="bottom",
                        fontsize=8.5, fontweight="bold", color="#1a365d", linespacing=1.1)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([STYLE[sy["kind"]][0] for sy in systems], fontsize=8)
        ax.set_title(f"{title(s)}\n{setting(s)}\n{s['machine']} · {s['date']}")
        ax.set_ylabel("tokens/s")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="y", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    kinds = [k for k in STYLE if any(sy["kind"] == k for s in scenarios for sy in s["systems"])]
    fig.legend(handles=[Patch(color=STYLE[k][1], label=STYLE[k][0].replace("\n", " ")) for k in kinds],
               loc="lower center", ncol=len(kinds), frameon=False)
    fig.suptitle("Training tokens/s: SlideDP and its peers, measured in the same `slidedp bench` command "
                 "(higher is better; each panel has its own scale; SlideDP n× = SlideDP's tokens/s over the peer's)",
                 fontsize=10.5)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def doc_block(text: str) -> str:
    """What docs/benchmarks.md holds between the markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReportError(f"the document must hold {BEGIN} once, then {END} once")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"


def with_block(text: str, block: str) -> str:
    doc_block(text)
    return text[:text.index(BEGIN) + len(BEGIN)] + "\n" + block + text[text.index(END):]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_report.py", description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", type=Path, default=SCENARIOS, help="the declared scenarios (JSON)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the result files named there lie")
    p.add_argument("--doc", type=Path, default=DOC, help="the document holding the table between the markers")
    p.add_argument("--png", type=Path, default=PNG, help="where to write the figure")
    p.add_argument("--no-png", action="store_true", help="do not write the figure")
    p.add_argument("--write", action="store_true", help="put the table into the document between the markers")
    p.add_argument("--check", action="store_true", help="exit 1 if the document's table is not this one")
    args = p.parse_args(argv)
    try:
        scenarios, machines = load(args.scenarios, args.results)
        block = markdown(scenarios, machines)
        if args.check:
            have = doc_block(args.doc.read_text(encoding="utf-8"))
            if have != block:
                sys.stdout.writelines(difflib.unified_diff(
                    have.splitlines(keepends=True), block.splitlines(keepends=True),
                    f"{args.doc} (as it is)", "scripts/bench_report.py (from the raw results)"))
                print(f"{args.doc}: the current-results table is not what the raw results give; "
                      "run scripts/bench_report.py --write", file=sys.stderr)
                return 1
            print(f"{args.doc}: the current-results table matches the raw results ({len(scenarios)} scenarios)")
            return 0
        if args.write:
            args.doc.write_text(with_block(args.doc.read_text(encoding="utf-8"), block), encoding="utf-8")
        else:
            sys.stdout.write(block)
        if not args.no_png:
            plot(scenarios, args.png)
    except ReportError as exc:
        print(f"bench_report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
