"""Named model shapes (random init) and parameter arithmetic that needs no torch.

Tiny presets train on a CPU in seconds and use the small tokenizer shipped in slidedp/assets/tokenizer.
The real-shape presets carry the published config.json figures of the models people fine-tune (Qwen3, Llama 3.1
and 3.2, Mistral 7B v0.3, Qwen2.5 7B): random weights at the true size, for benchmarks and plans, with no
tokenizer (they train on pre-tokenised data). The planner and the validation module size host state from these
figures without building a model.
"""

from __future__ import annotations

import json
import os
from typing import Any

from slidedp.model_sizing import shape_of

TINY_VOCAB = 512  # size of the tokenizer in slidedp/assets/tokenizer

_QWEN3_COMMON = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def _qwen3(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, tied: bool) -> dict[str, Any]:
    return {
        **_QWEN3_COMMON,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "tie_word_embeddings": tied,
    }


# Llama 3.1 and 3.2 stretch an 8k-token rope to 128k with the "llama3" frequency scaling; the 3.2 models use
# factor 32, Llama 3.1 factor 8.
def _llama3_rope(factor: float) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def _llama3(hidden: int, layers: int, heads: int, ffn: int, tied: bool, rope_factor: float,
            **extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "intermediate_size": ffn,
        "head_dim": hidden // heads,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": _llama3_rope(rope_factor),
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        **extra,
    }


_MISTRAL_7B_V03 = {
    "model_type": "mistral",
    "vocab_size": 32768,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "sliding_window": None,  # v0.3 attends over the whole context
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Qwen2's attention has biases on q, k and v (always, in transformers' Qwen2Attention) and none on o.
_QWEN25_7B = {
    "model_type": "qwen2",
    "vocab_size": 152064,
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}


def _tiny(model_type: str, **extra: Any) -> dict[str, Any]:
    cfg = {
        "model_type": model_type,
        "vocab_size": TINY_VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 160,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    cfg.update(extra)
    return cfg


PRESETS: dict[str, dict[str, Any]] = {
    # Tiny shapes for tests and the CPU demo (the tiny tokenizer ships with the package).
    "tiny-qwen3": _tiny("qwen3", head_dim=16),
    "tiny-qwen3-tied": _tiny("qwen3", head_dim=16, tie_word_embeddings=True),
    "tiny-qwen2": _tiny("qwen2"),
    "tiny-llama": _tiny("llama"),
    "tiny-mistral": _tiny("mistral", sliding_window=None),
    "demo-qwen3": _tiny("qwen3", hidden_size=128, num_hidden_layers=4, intermediate_size=384, head_dim=32,
                        num_attention_heads=4, num_key_value_heads=2),
    # Real Qwen3 shapes for benchmarks.
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072, True),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144, True),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728, True),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288, False),
    "qwen3-14b": _qwen3(5120, 40, 40, 8, 17408, False),
    "qwen3-32b": _qwen3(5120, 64, 64, 8, 25600, False),
    # Real shapes of other models people fine-tune (their published config.json).
    "llama3.2-1b": _llama3(2048, 16, 32, 8192, True, 32.0),
    "llama3.2-3b": _llama3(3072, 28, 24, 8192, True, 32.0),
    "llama3.1-8b": _llama3(4096, 32, 32, 14336, False, 8.0),
    "mistral-7b-v0.3": _MISTRAL_7B_V03,
    "qwen2.5-7b": _QWEN25_7B,
}

# Parameter counts the model cards publish, which the real-shape presets above must reproduce.
PUBLISHED_PARAMS = {
    "llama3.2-1b": 1.24e9,
    "llama3.2-3b": 3.21e9,
    "llama3.1-8b": 8.03e9,
    "mistral-7b-v0.3": 7.25e9,
    "qwen2.5-7b": 7.62e9,
}

SUPPORTED_ARCHITECTURES = ("qwen3", "qwen2", "llama", "mistral")
TINY_PRESETS = tuple(name for name in PRESETS if name.startswith(("tiny-", "demo-")))


def model_config_dict(model: str) -> dict[str, Any]:
    """The HF config of a preset or a local model directory, as a plain dict (no torch, no transformers)."""
    from slidedp.config import is_model_path

    if is_model_path(model):
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            return json.load(fh)
    return dict(PRESETS[model])


def head_dim(cfg: dict[str, Any]) -> int:
    """The attention's width per head as transformers builds it (slidedp.model_sizing)."""
    return shape_of(cfg).head_dim


def unit_param_counts(cfg: dict[str, Any]) -> list[int]:
    """Parameters per unit in streaming order: embedding, each decoder layer, final norm + lm_head, counted as
    transformers builds them, keys the config leaves out at their defaults (slidedp.model_sizing; ValueError for a
    config that does not size a model of a supported architecture).

    With tied embeddings the lm_head weight is the embedding's and is counted once, in unit 0.
    """
    return list(shape_of(cfg).unit_numels)


def param_count(cfg: dict[str, Any]) -> int:
    return sum(unit_param_counts(cfg))


def flops_per_token(cfg: dict[str, Any], seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, no recompute): 6 * matmul params + attention."""
    s = shape_of(cfg)
    matmul_params = sum(s.unit_numels[1:-1]) + s.vocab * s.hidden
    attn = 12 * s.num_layers * s.heads * s.head_dim * seq_len / 2
    return 6.0 * matmul_params + attn
