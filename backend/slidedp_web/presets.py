"""Form presets for the UI: complete job configs a user starts from."""

from __future__ import annotations

import os
from typing import Any

from slidedp_web.models import PresetPublic

_BIG_DATA_NOTE = (
    " Random-init preset weights: point `model` at a local Hugging Face directory to fine-tune real weights, "
    "and `data.path` at your dataset (format tokens needs rows of exactly seq_len token ids)."
)


def demo_config() -> dict[str, Any]:
    import slidedp
    import yaml

    path = os.path.join(os.path.dirname(slidedp.__file__), "assets", "demo", "job.yaml")
    with open(path, encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh) or {}
    cfg.pop("output_dir", None)  # each job gets its own directory under the data directory
    return cfg


def _gpu_config(model: str, gpus: int, micro_batch: int) -> dict[str, Any]:
    return {
        "model": model,
        "data": {"path": "data/train_tokens.jsonl", "format": "tokens", "shuffle": True, "seed": 0},
        "seq_len": 2048,
        "micro_batch_size": micro_batch,
        "grad_accum": 1,
        "steps": 200,
        "optimizer": {"lr": 1e-5, "weight_decay": 0.0, "max_grad_norm": 1.0},
        "schedule": {"warmup_steps": 10, "decay": "cosine", "min_lr_ratio": 0.1},
        "gpus": gpus,
        "precision": "bf16",
        "policy": {"delivery": "auto", "grad_reduce": "auto", "delivery_cast": "auto", "edge_update": "auto",
                   "activations": "auto"},
        "checkpoint": {"interval": 50, "keep": 2},
    }


def form_presets() -> list[PresetPublic]:
    items = []
    try:
        items.append(
            PresetPublic(
                id="cpu-demo",
                label="CPU demo",
                description="A tiny Qwen3-shaped model learns one-digit addition, counting and word reversal on the "
                "CPU in about a minute (no GPU, no downloads).",
                config=demo_config(),
            )
        )
    except (OSError, ImportError) as exc:  # a source tree without the demo assets still serves the others
        items.append(
            PresetPublic(id="cpu-demo", label="CPU demo", config={}, description=f"unavailable: {exc}")
        )
    items.append(
        PresetPublic(
            id="qwen3-8b-2gpu",
            label="Qwen3-8B on 2 GPUs",
            description="Full-parameter fine-tuning of Qwen3-8B on two GPUs, host state in RAM (≈ 115 GB), "
            "AutoPolicy choosing routes and activation placement." + _BIG_DATA_NOTE,
            config=_gpu_config("qwen3-8b", 2, 8),
        )
    )
    items.append(
        PresetPublic(
            id="qwen3-1.7b-1gpu",
            label="Qwen3-1.7B on 1 GPU",
            description="Qwen3-1.7B on a single GPU (host state ≈ 24 GB)." + _BIG_DATA_NOTE,
            config=_gpu_config("qwen3-1.7b", 1, 8),
        )
    )
    return items
