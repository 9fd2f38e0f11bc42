"""Which tokenizer a job uses: the model directory's own, the tiny one shipped for tiny presets, or none.

Imports no torch or transformers at module level: validation asks ``tokenizer_source`` whether a job has a
tokenizer without loading one. Real-shape presets (qwen3-8b, ...) are random-init shapes with no tokenizer,
so they train only on pre-tokenised data (format tokens).
"""

from __future__ import annotations

import os
from typing import Any

from slidedp.config import JobConfig, is_model_path
from slidedp.presets import TINY_PRESETS

TINY_TOKENIZER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tokenizer"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(model_dir: str) -> bool:
    return any(os.path.isfile(os.path.join(model_dir, f)) for f in TOKENIZER_FILES)


def tokenizer_source(model: str) -> str | None:
    """The directory the job's tokenizer loads from, or None when the model comes without one."""
    if is_model_path(model):
        return model if os.path.isdir(model) and has_tokenizer(model) else None
    if model in TINY_PRESETS:
        return TINY_TOKENIZER_DIR
    return None


def load_tokenizer(cfg: JobConfig) -> Any:
    """AutoTokenizer for the job's model (offline, local files only), or None when it has no tokenizer."""
    source = tokenizer_source(cfg.model)
    if source is None:
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, local_files_only=True)
