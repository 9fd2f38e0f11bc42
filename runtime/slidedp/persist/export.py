"""Export master weights as a Hugging Face model directory: from the host state, or from a checkpoint.

    final/
        config.json                         the model's config (architectures, dtype, use_cache on)
        generation_config.json              the source model's, else derived from the config
        model.safetensors                   one file while the weights fit in SHARD_BYTES, else
        model-0000i-of-0000n.safetensors    shards, filled in unit order
        model.safetensors.index.json        {"metadata": {"total_size"}, "weight_map": {tensor: file}}
        tokenizer files                     copied from the model directory or the shipped tiny tokenizer
        slidedp_job.json                    the job config the weights were trained with (JOB_FILE), when known:
                                            `slidedp generate` reads its data.format to format prompts as
                                            training formatted examples

That is what `AutoModelForCausalLM.from_pretrained` loads and vLLM serves. Weights are written in the training
precision (bf16 or fp32), from the fp32 master, one shard at a time, so the export never holds a second copy of
the model. The directory is written next to its destination and renamed into place, so `final/` is either the
previous export or the new one, never a mix.

One writer (`write_hf`) serves both sources: `export_hf` feeds it the host state's units at the end of a run, and
`export_checkpoint` feeds it a checkpoint's master.f32, read unit by unit without building a host state (the
retry after an export that failed, `slidedp export --checkpoint DIR`). Free disk is checked before anything is
written; any failure removes `final.tmp`, leaves the previous `final/` in place and raises `ExportError`, which
says how much room the export needs and where. Both return the files written: {"final_dir", "files": [{"name",
"bytes"}, ...]}.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from slidedp.config import JobConfig, is_model_path
from slidedp.persist.checkpoint import fsync_dir

SHARD_BYTES = 2 * 2**30
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges", "chat_template", "added_tokens")
SLACK_BYTES = 2**20  # config files, index, directory entries
JOB_FILE = "slidedp_job.json"  # the job config, written with the weights


class ExportError(OSError):
    """The Hugging Face export could not be written. `final/` is as it was and no `final.tmp` is left.

    needed_bytes: what the export takes on disk; free_bytes: what was free there (None: unknown);
    directory: the folder that holds final/ (the one that must have the room)."""

    def __init__(self, message: str, needed_bytes: int | None = None, free_bytes: int | None = None,
                 directory: str | None = None):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.directory = directory

    def __reduce__(self):  # keeps the fields across pickling (OSError's own reduce drops them)
        return (type(self), (str(self), self.needed_bytes, self.free_bytes, self.directory))


def format_bytes(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB"


def export_bytes(num_params: int, precision: str, extra: int = 0) -> int:
    """Disk an export takes: the weights in the training precision, plus `extra` (tokenizer files) and slack."""
    return num_params * (2 if precision == "bf16" else 4) + extra + SLACK_BYTES


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


def _tokenizer_files(model: str) -> list[str]:
    from slidedp.data.tokenizer import tokenizer_source

    tok = tokenizer_source(model)
    if not tok:
        return []
    return [os.path.join(tok, n) for n in sorted(os.listdir(tok))
            if n.startswith(TOKENIZER_PREFIXES) and os.path.isfile(os.path.join(tok, n))]


def _write_config(tmp: str, model: str, adapter, dtype: torch.dtype) -> None:
    import copy

    config = copy.deepcopy(adapter.config)  # the adapter's copy stays as the engine configured it
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", name)
    config.use_cache = True
    # vLLM picks the model class from `architectures`; a config built from a preset has none
    config.architectures = [type(adapter.meta_model).__name__]
    config.save_pretrained(tmp)
    source = os.path.join(model, "generation_config.json") if is_model_path(model) else None
    if source and os.path.isfile(source):
        shutil.copy2(source, os.path.join(tmp, "generation_config.json"))
        return
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(config).save_pretrained(tmp)


def _write_shards(tmp: str, adapter, units: Iterable[torch.Tensor], dtype: torch.dtype,
                  shard_bytes: int | None = None) -> None:
    """The weights as safetensors shards of at most shard_bytes (default SHARD_BYTES), written as they fill (at
    most one shard converted at a time)."""
    limit = shard_bytes or SHARD_BYTES
    import safetensors.torch

    weight_map: dict[str, str] = {}
    files: list[str] = []
    current: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal current, size
        if current:
            name = f"part-{len(files):05d}.safetensors"
            safetensors.torch.save_file(current, os.path.join(tmp, name), metadata={"format": "pt"})
            files.append(name)
            for k in current:
                weight_map[k] = name
            current, size = {}, 0

    source = iter(units)
    for spec in adapter.units:
        flat = next(source, None)
        if flat is None or flat.numel() != spec.numel:
            got = "nothing" if flat is None else f"{flat.numel()} values"
            raise ValueError(f"unit {spec.index} of the model has {spec.numel} parameters, the source gave {got}")
        for p in spec.params:
            t = flat[p.offset : p.offset + p.numel].view(p.shape).to(dtype, copy=True)
            nbytes = t.numel() * t.element_size()
            if size and size + nbytes > limit:
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


def write_hf(out_dir: str, model: str, precision: str, adapter, units: Iterable[torch.Tensor],
             job_config: dict[str, Any] | None = None, shard_bytes: int | None = None) -> dict[str, Any]:
    """Write a Hugging Face directory at out_dir from `units`, which yields each unit's flat fp32 master tensor
    in unit order; `model` (preset or directory) gives the generation config and tokenizer; `job_config`, when
    given, is written as JOB_FILE; shard_bytes: the largest shard (default SHARD_BYTES). Atomic: built in
    out_dir.tmp and swapped in. Returns {"final_dir", "files": [{"name", "bytes"}, ...]}; raises ExportError."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    tmp, old_dir = out_dir + ".tmp", out_dir + ".old"
    needed: int | None = None
    free: int | None = None
    swapped = False
    try:
        os.makedirs(parent, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = _tokenizer_files(model)
        needed = export_bytes(sum(u.numel for u in adapter.units), precision,
                              sum(os.path.getsize(f) for f in tokenizer))
        free = _free_bytes(parent)
        if free < needed:
            raise ExportError(f"the export needs {format_bytes(needed)} in {parent}, only {format_bytes(free)} is "
                              f"free: free disk there, or export elsewhere", needed, free, parent)
        os.makedirs(tmp)
        _write_shards(tmp, adapter, units, dtype, shard_bytes)
        _write_config(tmp, model, adapter, dtype)
        for path in tokenizer:
            shutil.copy2(path, os.path.join(tmp, os.path.basename(path)))
        if job_config is not None:
            with open(os.path.join(tmp, JOB_FILE), "w", encoding="utf-8") as fh:
                json.dump(job_config, fh, indent=2)
        files = []
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as fh:
                os.fsync(fh.fileno())
            files.append({"name": name, "bytes": os.path.getsize(os.path.join(tmp, name))})
        fsync_dir(tmp)
        # swap: the previous export is moved aside before the new one takes its name, then removed
        shutil.rmtree(old_dir, ignore_errors=True)
        if os.path.exists(out_dir):
            os.rename(out_dir, old_dir)
        os.replace(tmp, out_dir)
        swapped = True
        fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not swapped and os.path.isdir(old_dir) and not os.path.exists(out_dir):
            os.rename(old_dir, out_dir)  # the previous export back under its name
        if isinstance(exc, ExportError) or not isinstance(exc, Exception):
            raise
        try:
            free = _free_bytes(parent)
        except OSError:
            pass
        raise ExportError(f"the export to {out_dir} failed ({type(exc).__name__}: {exc}); it needs "
                          f"{format_bytes(needed)} in {parent}, {format_bytes(free)} is free there",
                          needed, free, parent) from exc
    shutil.rmtree(old_dir, ignore_errors=True)
    return {"final_dir": out_dir, "files": files}


def export_hf(out_dir: str, cfg: JobConfig, adapter, master) -> dict[str, Any]:
    """Export a job's master weights to out_dir. `master`: the host state (its master views are read in place) or
    an iterable yielding each unit's flat fp32 master tensor in unit order. Returns write_hf's dict."""
    if hasattr(master, "master_unit"):
        units: Iterable[torch.Tensor] = (master.master_unit(spec.index) for spec in adapter.units)
    else:
        units = master
    return write_hf(out_dir, cfg.model, cfg.precision, adapter, units, cfg.to_dict())


def _checkpoint_units(path: str, numels: list[int]) -> Iterator[torch.Tensor]:
    """Each unit's fp32 master weights, read in turn from a checkpoint's master.f32 (opened read-only)."""
    import numpy as np

    with open(path, "rb") as fh:
        for u, n in enumerate(numels):
            values = np.fromfile(fh, dtype="<f4", count=n)
            if values.size != n:
                raise OSError(f"{path}: short read in unit {u} ({values.size} of {n} values)")
            yield torch.from_numpy(values)


def export_checkpoint(checkpoint_dir: str, out_dir: str | None = None) -> dict[str, Any]:
    """Export a checkpoint's master weights as a Hugging Face directory, without a host state.

    The model and precision come from the checkpoint's meta.json; master.f32 is only read. out_dir defaults to
    the run's final/ (the checkpoint's output_dir: checkpoints/step-N/../../final). Returns write_hf's dict;
    raises ExportError (also for a checkpoint that is incomplete or whose model cannot be loaded)."""
    from slidedp.persist import checkpoint as ckpt
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    path = os.path.abspath(checkpoint_dir)
    if not os.path.isdir(path):
        raise ExportError(f"checkpoint directory {path} does not exist")
    if not ckpt.is_complete(path):
        raise ExportError(f"{path} is not a complete checkpoint: its meta.json is missing or unreadable, or an "
                          "array is shorter than meta.json announces")
    meta = ckpt.read_meta(path)
    config = meta.get("config") or {}
    model, precision = config.get("model"), config.get("precision", "bf16")
    if not isinstance(model, str) or precision not in ("bf16", "fp32"):
        raise ExportError(f"{path}/meta.json names no model or precision to export ({model!r}, {precision!r})")
    try:
        adapter = ModelAdapter(load_hf_config(model))
    except (OSError, KeyError, ValueError) as exc:
        raise ExportError(f"the checkpoint's model {model!r} cannot be loaded to name its tensors: {exc}") from exc
    numels = [u.numel for u in adapter.units]
    if [int(n) for n in meta["unit_numels"]] != numels:
        raise ExportError(f"{path} does not match its model {model!r} ({sum(int(n) for n in meta['unit_numels'])} "
                          f"parameters in the checkpoint, {sum(numels)} in the model)")
    if out_dir is None:
        out_dir = os.path.join(os.path.dirname(os.path.dirname(path)), "final")
    return write_hf(out_dir, model, precision, adapter,
                    _checkpoint_units(os.path.join(path, "master.f32"), numels), config)
