"""A model's unit sizes from its Hugging Face config given as a dict, as transformers builds the model: the
architecture's defaults for the keys a config leaves out, the head size and KV heads its attention is built with, and
the parameters of each unit the engine streams (embedding, each decoder layer, final norm + lm_head).

Imports nothing of slidedp (slidedp.presets counts its presets with it; slidedp.model_shape reads a preset or a
model directory into it), no torch and no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def shape_of(config: dict[str, Any], where: str = "the model's config") -> ModelShape:
    """The shape of an HF config given as a dict (config.json's keys, or a preset's)."""
    mt = config.get("model_type")
    if mt not in SHAPE_DEFAULTS:
        raise ValueError(f"architecture {mt!r} is not supported ({', '.join(SHAPE_DEFAULTS)})")
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


def layer_forward_flops(s: ModelShape, micro_batch: int, seq: int) -> tuple[float, float]:
    """(matmul, attention) FLOPs of one decoder layer's forward over one micro-batch of `micro_batch` sequences of
    `seq` tokens: the q, k, v, o projections and the gated MLP's three matmuls per token, and causal attention's
    scores and weighted sum (2 * seq * seq * heads * head_dim each a sequence, half of it under the causal mask).
    Its backward does twice the forward's work; a checkpointed layer's recompute once more."""
    qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    matmul = 2.0 * micro_batch * seq * (2 * s.hidden * qd + 2 * s.hidden * kvd + 3 * s.hidden * s.intermediate)
    attention = 2.0 * micro_batch * seq * seq * qd
    return matmul, attention


def sizing_config(config: dict[str, Any], where: str = "the model's config") -> dict[str, Any]:
    """The config with every key that sizes a unit as transformers reads it: the architecture's default for each
    key the file leaves out, and num_key_value_heads and head_dim the numbers the attention is built with (a
    Qwen3 config without head_dim is 128 wide per head, not hidden / heads). What the planner reads of a model
    (planning.job.Job.model_cfg). Raises ValueError as shape_of does."""
    s = shape_of(config, where)
    return {**SHAPE_DEFAULTS[s.model_type], **config, "hidden_size": s.hidden, "vocab_size": s.vocab,
            "intermediate_size": s.intermediate, "num_hidden_layers": s.num_layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "tie_word_embeddings": s.tied}
