"""What planning needs of a model, read without torch or transformers: its architecture, depth, widths and the
parameters of each unit the engine streams (embedding, each decoder layer, final norm + lm_head).

A preset gives its own figures; a local Hugging Face directory its config.json. A key the file leaves out takes
the default of transformers' config class for that architecture (SHAPE_DEFAULTS), and each unit is counted as
transformers' decoder builds it (slidedp.step.model_adapter: Qwen3, Qwen2/2.5, Llama, Mistral), so the figures are
the ones the model built on the meta device gives (tests/runtime/test_model_shape.py compares them for every preset
and for written directories). The launcher plans and lays out the host state from them; the meta model itself is
built later, beside the ranks' start, for filling the host state, and checked against them there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from slidedp.config import is_model_path
from slidedp.presets import PRESETS, SUPPORTED_ARCHITECTURES

# transformers' config-class defaults of the keys that size a unit, per model_type (absent: the class has no such
# field). num_key_value_heads None means "as many as num_attention_heads", head_dim None "hidden_size //
# num_attention_heads".
SHAPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "tie_word_embeddings": False,
              "attention_bias": False},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False},
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "tie_word_embeddings": False},
}
assert set(SHAPE_DEFAULTS) == set(SUPPORTED_ARCHITECTURES)


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    num_layers: int
    hidden: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    unit_numels: tuple[int, ...]  # parameters per unit in streaming order: embedding, layers, head

    @property
    def params(self) -> int:
        return sum(self.unit_numels)


def read_shape(model: str) -> ModelShape:
    """The shape of a preset or a local model directory (never a download), with the errors
    model_adapter.load_hf_config gives for the same inputs: an unknown preset (KeyError), a missing directory or
    config.json (FileNotFoundError), an unsupported architecture or a key that does not size a model
    (ValueError)."""
    if is_model_path(model):
        if not os.path.isdir(model):
            raise FileNotFoundError(f"model directory {model!r} does not exist")
        path = os.path.join(model, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model directory {model!r} has no config.json")
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
        if not isinstance(config, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return shape_of(config, where=path)
    if model not in PRESETS:
        raise KeyError(f"unknown model preset {model!r}; presets: {', '.join(PRESETS)}")
    return shape_of(PRESETS[model], where=f"preset {model}")


def shape_of(config: dict[str, Any], where: str = "the model's config") -> ModelShape:
    """The shape of an HF config given as a dict (config.json's keys, or a preset's)."""
    mt = config.get("model_type")
    if mt not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {mt!r} is not supported ({', '.join(SUPPORTED_ARCHITECTURES)})")
    c = {**SHAPE_DEFAULTS[mt], **config}

    def count(key: str, value: Any = None) -> int:
        v = c[key] if value is None else value
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{where}: {key} must be a positive integer, not {v!r}")
        return v

    h, v, f = count("hidden_size"), count("vocab_size"), count("intermediate_size")
    layers, nh = count("num_hidden_layers"), count("num_attention_heads")
    if mt == "mistral":  # an int field: null is refused by the config class, so it is here
        nkv = count("num_key_value_heads")
    else:  # None: as many as the attention heads
        nkv = count("num_key_value_heads", nh if c.get("num_key_value_heads") is None else c["num_key_value_heads"])
    if mt == "qwen3":  # an int field, refused as null
        hd = count("head_dim")
    elif mt == "mistral":  # the attention takes hidden_size // heads for a head_dim of None or 0
        hd = count("head_dim", c.get("head_dim") or h // nh)
    else:  # llama: None is hidden_size // heads; qwen2: a head_dim given is used, none given is hidden // heads
        hd = count("head_dim", h // nh if c.get("head_dim", None) is None else c["head_dim"])
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h  # q, k, v, o
    if mt == "qwen2":
        attn += nh * hd + 2 * nkv * hd  # q, k and v always have biases, o never
    elif mt in ("qwen3", "llama") and c.get("attention_bias"):
        attn += nh * hd + 2 * nkv * hd + h  # q, k, v and o biases
    if mt == "qwen3":
        attn += 2 * hd  # q_norm, k_norm
    mlp = 3 * h * f + (2 * f + h if mt == "llama" and c.get("mlp_bias") else 0)
    layer = attn + mlp + 2 * h  # and the two RMSNorms
    tied = bool(c.get("tie_word_embeddings"))
    units = (v * h,) + (layer,) * layers + (h + (0 if tied else v * h),)
    return ModelShape(mt, layers, h, v, f, nh, nkv, hd, tied, units)


def sizing_config(config: dict[str, Any], where: str = "the model's config") -> dict[str, Any]:
    """The config with every key that sizes a unit as transformers reads it: the architecture's default for each
    key the file leaves out, and num_key_value_heads and head_dim the numbers the attention is built with (a
    Qwen3 config without head_dim is 128 wide per head, not hidden / heads). What the planner reads of a model
    (planning.job.Job.model_cfg). Raises ValueError as shape_of does."""
    s = shape_of(config, where)
    return {**SHAPE_DEFAULTS[s.model_type], **config, "hidden_size": s.hidden, "vocab_size": s.vocab,
            "intermediate_size": s.intermediate, "num_hidden_layers": s.num_layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "tie_word_embeddings": s.tied}


class ModelOnDemand:
    """The launcher's ModelAdapter (slidedp.launch) (transformers' model on the meta device: unit layout, parameter names, initial
    weights), built the first time the host state is filled or exported from it, which for a run from step 0 is
    once its ranks are spawned, so that importing transformers here overlaps their start instead of delaying the
    plan. Its units must hold the parameters the plan and the host layout were made for (slidedp.model_shape);
    a model that differs is refused before any weight is written."""

    def __init__(self, model: str, unit_numels: list[int]):
        self.model, self.unit_numels = model, list(unit_numels)
        self._adapter = None

    def get(self):
        if self._adapter is None:
            from slidedp.step.model_adapter import ModelAdapter, load_hf_config

            adapter = ModelAdapter(load_hf_config(self.model))
            built = [u.numel for u in adapter.units]
            if built != self.unit_numels:
                raise RuntimeError(f"model {self.model!r}: transformers builds {len(built)} units of "
                                   f"{sum(built):,} parameters ({built[:3]}...), its config was read as "
                                   f"{len(self.unit_numels)} units of {sum(self.unit_numels):,} "
                                   f"({self.unit_numels[:3]}...): slidedp.model_shape does not read this config "
                                   "as transformers does")
            self._adapter = adapter
        return self._adapter
