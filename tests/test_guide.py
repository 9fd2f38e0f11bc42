"""docs/guide.md runs as written: each ```sh block marked `# guide-step: NAME` is run in order, in a shell, with
MODEL_DIR, DATA and OUT replaced by a tiny model folder and chat dataset this test writes, so the guide's commands
cannot drift from the CLI.

    .venv/bin/python -m pytest -q tests/test_guide.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
STEPS = ("config", "plan", "train", "watch", "generate", "export", "resume")
BLOCK = re.compile(r"```sh\n# guide-step: (\w+)\n(.*?)```", re.S)

pytestmark = pytest.mark.slow


def guide_steps() -> dict[str, str]:
    return {name: body for name, body in BLOCK.findall(GUIDE.read_text())}


def make_model_dir(path: Path) -> None:
    import torch
    from slidedp.data.tokenizer import TINY_TOKENIZER_DIR
    from slidedp.presets import PRESETS
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(TINY_TOKENIZER_DIR, path)
    d = dict(PRESETS["tiny-qwen3"])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d)).save_pretrained(path)


def make_chat_data(path: Path, rows: int = 40) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            a, b = i % 7, i % 5
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                              {"role": "assistant", "content": str(a + b)}]}) + "\n")


def test_the_guide_has_every_step_in_order():
    assert tuple(guide_steps()) == STEPS


def test_the_guides_commands_fine_tune_a_model_folder_on_a_chat_dataset(tmp_path):
    make_model_dir(tmp_path / "model")
    make_chat_data(tmp_path / "chat.jsonl")
    out = tmp_path / "run"
    bindir = tmp_path / "bin"  # `slidedp` and `python` as a user's shell finds them: this environment's
    bindir.mkdir()
    (bindir / "slidedp").write_text(f"#!/bin/sh\nexec {sys.executable} -m slidedp.cli \"$@\"\n")
    (bindir / "slidedp").chmod(0o755)
    (bindir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # a link would lose the venv
    (bindir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLIDEDP_CACHE_DIR": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "runtime")}
    said = {}
    for name, body in guide_steps().items():
        script = body.replace("MODEL_DIR", str(tmp_path / "model")).replace("DATA", str(tmp_path / "chat.jsonl"))
        script = script.replace("OUT", str(out))
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"guide step {name} failed:\n{script}\n{proc.stdout}\n{proc.stderr}"
        said[name] = proc.stdout
    assert said["config"].strip().endswith("ok")
    assert "predicted:" in said["plan"]
    assert json.loads(said["train"].strip().splitlines()[-1])["status"] == "completed"
    last, last_eval = (json.loads(line) for line in said["watch"].strip().splitlines())
    assert last["step"] == 4 and "eval_loss" in last_eval
    assert (out / "exported" / "config.json").is_file() and "What is 2 + 2?" in said["export"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r][-1] == 6  # resumed to step 6
