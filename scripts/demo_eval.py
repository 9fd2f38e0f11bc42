"""Exact-match rate of the CPU demo's trained model on prompts it never trained on.

    .venv/bin/slidedp train --config runtime/slidedp/assets/demo/job.yaml --set output_dir=runs/demo
    .venv/bin/python scripts/demo_eval.py --model runs/demo/final [--seen 20] [--json]

The held-out prompts are runtime/slidedp/assets/demo/demo_heldout.jsonl: 20 examples of the demo's own tasks that
the training file (demo_sft.jsonl) does not hold. Every one-digit sum and every count from 0 to 98 is in the
training file, so the held-out set is the one count past it ("after 99 comes") and 19 word reversals whose word
lists training never showed. Each prompt is answered greedily by `slidedp.generate` in the demo's format
(prompt_completion, read from the export's job config) and counts as a match when the answer, stripped of
surrounding spaces, equals the expected completion exactly: an answer that goes on past it is a miss.
`--seen N` scores the first N training examples the same way, for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "runtime" / "slidedp" / "assets" / "demo"
MAX_NEW_TOKENS = 16  # the longest expected answer is 4 words; a model that does not stop is cut here


def score(gen, rows: list[dict]) -> tuple[int, list[dict]]:
    results = []
    for row in rows:
        out = gen(row["prompt"], max_new_tokens=MAX_NEW_TOKENS)
        ok = out.text.strip() == row["completion"].strip()
        results.append({"prompt": row["prompt"], "expected": row["completion"].strip(), "got": out.text,
                        "match": ok})
    return sum(r["match"] for r in results), results


def read(path: Path, limit: int | None = None) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows[:limit] if limit is not None else rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "runs" / "demo" / "final"),
                    help="the demo run's export (default runs/demo/final)")
    ap.add_argument("--seen", type=int, default=0, metavar="N", help="also score the first N training examples")
    ap.add_argument("--json", action="store_true", help="print every answer as JSON")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "runtime"))
    from slidedp.generate import GenerateError, Generator

    try:
        gen = Generator(args.model)
    except GenerateError as exc:
        print(f"demo_eval: {exc}", file=sys.stderr)
        return 2
    report = {"model": args.model, "format": gen.format, "max_new_tokens": MAX_NEW_TOKENS}
    sets = [("held-out", read(DEMO / "demo_heldout.jsonl"))]
    if args.seen > 0:
        sets.append(("seen in training", read(DEMO / "demo_sft.jsonl", args.seen)))
    for name, rows in sets:
        hits, results = score(gen, rows)
        report[name] = {"matches": hits, "prompts": len(rows), "rate": hits / len(rows)}
        if args.json:
            report[name]["answers"] = results
        else:
            for r in results:
                print(f"{'ok  ' if r['match'] else 'miss'} {r['prompt']!r}: expected {r['expected']!r}, "
                      f"got {r['got'].strip()!r}")
            print(f"{name}: {hits}/{len(rows)} exact matches ({100 * hits / len(rows):.0f} %)\n")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
