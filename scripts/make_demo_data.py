"""Write the demo task dataset shipped in runtime/slidedp/assets/demo/ (deterministic; run it again to check).

    .venv/bin/python scripts/make_demo_data.py            # rewrite the files
    .venv/bin/python scripts/make_demo_data.py --check    # exit 1 if the committed files differ

The task mixes three small, fully determined skills, so a tiny model can learn part of it within a minute on a
CPU and its loss falls visibly: one-digit addition ("3 + 5 = 8"), counting ("after 41 comes 42") and reversing
a short list of words ("reverse: red cat sun -> sun cat red"). The same examples are written twice:

    demo_text.jsonl        {"text": "<prompt><completion>"}       for data.format = text
    demo_sft.jsonl         {"prompt": ..., "completion": ...}     for data.format = prompt_completion

In job configs they are named `demo:demo_text.jsonl` and `demo:demo_sft.jsonl` (see slidedp.data.demo_paths()).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "runtime" / "slidedp" / "assets" / "demo"
EXAMPLES = 2400
WORDS = (
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "sun",
    "moon",
    "tree",
    "fish",
    "bird",
    "star",
    "rock",
    "one",
    "two",
    "big",
    "old",
)


def demo_examples(n: int = EXAMPLES, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, completion) pairs; the completion starts with the space that separates it from the prompt."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            a, b = rng.randrange(10), rng.randrange(10)
            out.append((f"{a} + {b} =", f" {a + b}"))
        elif kind == 1:
            a = rng.randrange(99)
            out.append((f"after {a} comes", f" {a + 1}"))
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
            out.append(("reverse: " + " ".join(words) + " ->", " " + " ".join(reversed(words))))
    return out


def render() -> dict[str, str]:
    pairs = demo_examples()
    text = "".join(json.dumps({"text": p + c}) + "\n" for p, c in pairs)
    sft = "".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs)
    return {"demo_text.jsonl": text, "demo_sft.jsonl": sft}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="compare with the committed files instead of writing"
    )
    args = ap.parse_args()
    files = render()
    if args.check:
        stale = [n for n, body in files.items() if not (OUT / n).is_file() or (OUT / n).read_text() != body]
        if stale:
            print("out of date: " + ", ".join(stale) + " (run scripts/make_demo_data.py)", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (OUT / name).write_text(body)
        print(f"wrote {OUT / name} ({len(body.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
