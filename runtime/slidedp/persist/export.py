"""Export the host state's master weights as a Hugging Face model directory.

    final/
        config.json                         the model's config (architectures, dtype, use_cache on)
        generation_config.json              the source model's, else derived from the config
        model.safetensors                   one file while the weights fit in SHARD_BYTES, else
        model-0000i-of-0000n.safetensors    shards, filled in unit order
        model.safetensors.index.json        {"metadata": {"total_size"}, "weight_map": {tensor: file}}
        tokenizer files                     copied from the model directory or the shipped tiny tokenizer

That is what `AutoModelForCausalLM.from_pretrained` loads and vLLM serves. Weights are written in the training
precision (bf16 or fp32), from the fp32 master, one shard at a time, so the export never holds a second copy of
the model. The directory is written next to its destination and renamed into place, so `final/` is either the
previous export or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil

import torch

from slidedp.config import JobConfig, is_model_path
from slidedp.persist.checkpoint import fsync_dir

SHARD_BYTES = 2 * 2**30
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges", "chat_template", "added_tokens")


def _tokenizer_dir(cfg: JobConfig) -> str | None:
    from slidedp.data.tokenizer import tokenizer_source

    return tokenizer_source(cfg.model)


def _write_config(tmp: str, cfg: JobConfig, adapter, dtype: torch.dtype) -> None:
    import copy

    config = copy.deepcopy(adapter.config)  # the adapter's copy stays as the engine configured it
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", name)
    config.use_cache = True
    # vLLM picks the model class from `architectures`; a config built from a preset has none
    config.architectures = [type(adapter.meta_model).__name__]
    config.save_pretrained(tmp)
    source = os.path.join(cfg.model, "generation_config.json") if is_model_path(cfg.model) else None
    if source and os.path.isfile(source):
        shutil.copy2(source, os.path.join(tmp, "generation_config.json"))
        return
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(config).save_pretrained(tmp)


def export_hf(out_dir: str, cfg: JobConfig, adapter, state) -> str:
    from safetensors.torch import save_file

    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    out_dir = os.path.abspath(out_dir)
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
    _write_config(tmp, cfg, adapter, dtype)
    tok = _tokenizer_dir(cfg)
    if tok:
        for name in os.listdir(tok):
            if name.startswith(TOKENIZER_PREFIXES) and os.path.isfile(os.path.join(tok, name)):
                shutil.copy2(os.path.join(tok, name), os.path.join(tmp, name))
    for name in os.listdir(tmp):
        with open(os.path.join(tmp, name), "rb") as fh:
            os.fsync(fh.fileno())
    # swap: the previous export is moved aside before the new one takes its name, then removed
    old_dir = out_dir + ".old"
    shutil.rmtree(old_dir, ignore_errors=True)
    if os.path.exists(out_dir):
        os.rename(out_dir, old_dir)
    os.replace(tmp, out_dir)
    fsync_dir(os.path.dirname(out_dir))
    shutil.rmtree(old_dir, ignore_errors=True)
    return out_dir
