"""Split a Hugging Face decoder into the ordered units the engine streams.

Unit 0 is the token embedding, units 1..L the decoder layers, unit L+1 the final norm and lm_head. With tied
embeddings the lm_head weight *is* unit 0's weight: the head unit then holds only the norm, and the head's
gradient for the tied weight is accumulated into unit 0's gradient (unit 0 finishes backward last anyway).

The layers run through transformers' own classes (Qwen3, Qwen2/2.5, Llama 3.x, Mistral): one template module per
unit kind lives on the meta device and is called with parameters that are views of a window buffer, so the same
template serves every layer and no module ever owns GPU memory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from slidedp.config import is_model_path
from slidedp.presets import PRESETS, SUPPORTED_ARCHITECTURES
from torch import nn
from torch.func import functional_call


@dataclass
class ParamSlot:
    name: str  # name inside the unit's template module ("self_attn.q_proj.weight")
    hf_name: str  # name in the HF checkpoint ("model.layers.3.self_attn.q_proj.weight")
    shape: tuple[int, ...]
    offset: int  # element offset inside the unit's flat buffer

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class UnitSpec:
    index: int
    kind: str  # "embed" | "layer" | "head"
    params: list[ParamSlot] = field(default_factory=list)
    layer_index: int | None = None

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


def load_hf_config(model: str):
    """The transformers config of a local model directory or a preset (never a download)."""
    from transformers import AutoConfig

    if is_model_path(model):
        if not os.path.isdir(model):
            raise FileNotFoundError(f"model directory {model!r} does not exist")
        cfg = AutoConfig.from_pretrained(model, local_files_only=True)
    else:
        if model not in PRESETS:
            raise KeyError(f"unknown model preset {model!r}; presets: {', '.join(PRESETS)}")
        d = dict(PRESETS[model])
        cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    if cfg.model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {cfg.model_type!r} is not supported ({', '.join(SUPPORTED_ARCHITECTURES)})")
    # Dropout-free training, sdpa kernels; the engine never uses a KV cache.
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    return cfg


class ModelAdapter:
    """Units, templates and the per-unit compute of one decoder architecture."""

    def __init__(self, hf_config):
        from transformers import AutoModelForCausalLM

        self.config = hf_config
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        with torch.device("meta"):
            # The whole model on meta costs nothing and gives transformers' own layer, norm and rotary classes.
            self.meta_model = AutoModelForCausalLM.from_config(hf_config)
        inner = self.meta_model.model
        self.layer_template = inner.layers[0]
        self.norm_template = inner.norm
        self.num_layers = hf_config.num_hidden_layers
        self.hidden = hf_config.hidden_size
        self.vocab = hf_config.vocab_size
        self.pad_token_id = getattr(inner.embed_tokens, "padding_idx", None)
        self.units = self._build_units()

    # ------------------------------------------------------------------ layout
    def _build_units(self) -> list[UnitSpec]:
        units = [UnitSpec(0, "embed", [ParamSlot("weight", "model.embed_tokens.weight", (self.vocab, self.hidden), 0)])]
        layer_params = list(self.layer_template.named_parameters())
        for i in range(self.num_layers):
            spec = UnitSpec(i + 1, "layer", layer_index=i)
            off = 0
            for name, p in layer_params:
                spec.params.append(ParamSlot(name, f"model.layers.{i}.{name}", tuple(p.shape), off))
                off += p.numel()
            units.append(spec)
        head = UnitSpec(self.num_layers + 1, "head", [ParamSlot("norm.weight", "model.norm.weight", (self.hidden,), 0)])
        if not self.tied:
            head.params.append(ParamSlot("lm_head.weight", "lm_head.weight", (self.vocab, self.hidden), self.hidden))
        units.append(head)
        return units

    @property
    def max_layer_numel(self) -> int:
        return self.units[1].numel if self.num_layers else 0

    # ------------------------------------------------------------------ initial weights
    def init_unit(self, spec: UnitSpec, flat: torch.Tensor, seed: int) -> None:
        """Random init of one unit into its fp32 host slice, as transformers initialises the model."""
        # torch takes a 64-bit seed; every seed below 2**64 / 1_000_003 keeps the weights it always had
        gen = torch.Generator().manual_seed((seed * 1_000_003 + spec.index) % 2**64)
        std = float(getattr(self.config, "initializer_range", 0.02))
        for p in spec.params:
            view = flat[p.offset : p.offset + p.numel].view(p.shape)
            if p.name.endswith("norm.weight") or "layernorm" in p.name or p.name.endswith("_norm.weight"):
                view.fill_(1.0)
            elif p.name.endswith(".bias"):
                view.zero_()
            else:
                view.normal_(0.0, std, generator=gen)
        if spec.kind == "embed" and self.pad_token_id is not None:
            flat.view(self.vocab, self.hidden)[self.pad_token_id].zero_()

    def load_unit(self, spec: UnitSpec, flat: torch.Tensor, model_dir: str, index: dict[str, str]) -> None:
        """Copy one unit's tensors from a local safetensors checkpoint into its fp32 host slice."""
        from safetensors import safe_open

        by_file: dict[str, list[ParamSlot]] = {}
        for p in spec.params:
            name = p.hf_name
            if name not in index and name == "lm_head.weight" and "model.embed_tokens.weight" in index:
                name = "model.embed_tokens.weight"  # checkpoints of untied configs that still share the tensor
            if name not in index:
                raise KeyError(f"{model_dir}: tensor {p.hf_name!r} is missing from the checkpoint")
            by_file.setdefault(index[name], []).append(p)
        for fname, params in by_file.items():
            with safe_open(os.path.join(model_dir, fname), framework="pt") as fh:
                for p in params:
                    name = p.hf_name if p.hf_name in index else "model.embed_tokens.weight"
                    t = fh.get_tensor(name)
                    if tuple(t.shape) != p.shape:
                        raise ValueError(f"{model_dir}: {name} has shape {tuple(t.shape)}, config says {p.shape}")
                    flat[p.offset : p.offset + p.numel].view(p.shape).copy_(t)

    # ------------------------------------------------------------------ compute
    def param_views(self, spec: UnitSpec, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {p.name: buf[p.offset : p.offset + p.numel].view(p.shape) for p in spec.params}

    def param_leaves(self, spec: UnitSpec, buf: torch.Tensor,
                     grad_flat: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The unit's parameters as autograd leaves viewing `buf`, their gradients accumulated into views of
        `grad_flat` where given (else set later, by the backward's caller)."""
        out = {}
        for p in spec.params:
            leaf = buf[p.offset : p.offset + p.numel].view(p.shape).detach().requires_grad_(True)
            if grad_flat is not None:
                leaf.grad = grad_flat[p.offset : p.offset + p.numel].view(p.shape)
            out[p.name] = leaf
        return out

    def rotary(self, device: torch.device) -> nn.Module:
        """A real rotary-embedding module on the device (it has buffers, no parameters)."""
        rot = type(self.meta_model.model.rotary_emb)(config=self.config)
        return rot.to(device)

    def embed_forward(self, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, weight)

    def embed_backward(self, grad_weight: torch.Tensor, input_ids: torch.Tensor, grad_h: torch.Tensor) -> None:
        """Accumulate d loss / d embedding into grad_weight [V, H].

        The padding row gets no gradient from the lookup (as nn.Embedding(padding_idx=...)); with tied embeddings it
        still gets the lm_head's, which is already in grad_weight. Masking (not indexing) keeps the GPU free of syncs.
        """
        g = grad_h.reshape(-1, grad_h.shape[-1]).to(grad_weight.dtype)
        ids = input_ids.reshape(-1)
        if self.pad_token_id is not None:
            g = g * (ids != self.pad_token_id).unsqueeze(-1).to(g.dtype)
        grad_weight.index_add_(0, ids, g)

    def layer_forward(self, params: dict[str, torch.Tensor], h: torch.Tensor, ctx: dict[str, Any]) -> torch.Tensor:
        out = functional_call(
            self.layer_template,
            params,
            (h,),
            {"attention_mask": ctx.get("attention_mask"), "position_embeddings": ctx["position_embeddings"],
             "position_ids": ctx["position_ids"]},
            strict=True,
        )
        return out[0] if isinstance(out, tuple) else out

    def norm_forward(self, weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return functional_call(self.norm_template, {"weight": weight}, (h,), strict=True)


def checkpoint_index(model_dir: str) -> dict[str, str]:
    """{tensor name: safetensors file} of a local HF directory (sharded or single-file)."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx, encoding="utf-8") as fh:
            return dict(json.load(fh)["weight_map"])
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        from safetensors import safe_open

        with safe_open(single, framework="pt") as fh:
            return {k: "model.safetensors" for k in fh.keys()}
    raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
