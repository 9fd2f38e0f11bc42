"""Export the host state's master weights as a Hugging Face model directory.

config.json, safetensors shards with an index, tokenizer files and a generation config: what
`AutoModelForCausalLM.from_pretrained` loads and vLLM serves. Weights are written in the training precision
(bf16 or fp32), from the fp32 master, one unit at a time, so the export never needs a second copy of the model.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from slidedp.config import JobConfig

SHARD_BYTES = 2 * 2**30


def _tokenizer_dir(cfg: JobConfig) -> str | None:
    from slidedp.data.tokenizer import tokenizer_source

    return tokenizer_source(cfg.model)


def export_hf(out_dir: str, cfg: JobConfig, adapter, state) -> str:
    from safetensors.torch import save_file

    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # Shards are written as they fill, so at most one shard's worth of converted weights is in memory.
    weight_map: dict[str, str] = {}
    files: list[str] = []
    current: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal current, size
        if current:
            name = f"part-{len(files):05d}.safetensors"
            save_file(current, os.path.join(tmp, name), metadata={"format": "pt"})
            files.append(name)
            for k in current:
                weight_map[k] = name
            current, size = {}, 0

    for spec in adapter.units:
        flat = state.master_unit(spec.index)
        for p in spec.params:
            t = flat[p.offset : p.offset + p.numel].view(p.shape).to(dtype, copy=True)
            nbytes = t.numel() * t.element_size()
            if size and size + nbytes > SHARD_BYTES:
                flush()
            current[p.hf_name] = t
            size += nbytes
            total += nbytes
    flush()
    # HF names: model.safetensors for one file, model-0000i-of-0000n.safetensors for several
    final_names = (["model.safetensors"] if len(files) == 1 else
                   [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])
    rename = dict(zip(files, final_names))
    for old, new in rename.items():
        os.replace(os.path.join(tmp, old), os.path.join(tmp, new))
    weight_map = {k: rename[v] for k, v in weight_map.items()}
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    config = adapter.config
    config.torch_dtype = "bfloat16" if dtype == torch.bfloat16 else "float32"
    config.use_cache = True
    config.save_pretrained(tmp)
    try:
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(tmp)
    except Exception:  # older configs without generation fields still load without it
        pass
    tok = _tokenizer_dir(cfg)
    if tok:
        for name in os.listdir(tok):
            if name.startswith(("tokenizer", "special_tokens_map", "vocab", "merges", "chat_template",
                                "added_tokens")):
                shutil.copy2(os.path.join(tok, name), os.path.join(tmp, name))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir
