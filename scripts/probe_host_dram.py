"""How steady is calibration's host memory figure? Run `host_dram` (slidedp.planning.microbench) several times in one
process, alternating its timing window: 0 (three updates, as calibrations timed it before `window_s`) and the
window calibration uses now, and print each run's figures and the spread (max / min) of each per window.

    PYTHONPATH=runtime python3 scripts/probe_host_dram.py --model qwen3-4b --rounds 4 --out host_dram.jsonl

Needs a CUDA GPU (the figures are the host update beside the GPUs' copies).
"""

from __future__ import annotations

import argparse
import json
import sys

from slidedp.config import JobConfig
from slidedp.planning import microbench
from slidedp.planning.topology import detect

FIGURES = ("update_alone_s_per_1e9", "update_with_dma_s_per_1e9", "dma_alone_GBps", "dma_with_update_GBps",
           "capacity_GBps")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--windows", default=f"0,{microbench.HOST_WINDOW_S:g}", help="seconds, comma-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cfg = JobConfig.from_dict({"model": args.model, "data": {"path": "x.jsonl"}, "gpus": args.gpus})
    topology = detect()
    windows = [float(w) for w in args.windows.split(",")]
    rows = []
    for r in range(args.rounds):
        for w in windows:
            got = microbench.host_dram(cfg, topology, window_s=w)
            row = {"round": r, "window_s": w, **{k: round(got[k], 4) for k in FIGURES}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for w in windows:
        mine = [row for row in rows if row["window_s"] == w]
        spread = {k: round(max(x[k] for x in mine) / min(x[k] for x in mine), 3) for k in FIGURES}
        print(json.dumps({"window_s": w, "runs": len(mine), "max_over_min": spread}), flush=True)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
