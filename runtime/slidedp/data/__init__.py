"""Datasets in, micro-batches out: file readers, formats, tokenizer, packing and the per-rank pipeline.

    from slidedp.data import DataPipeline, load_tokenizer
    data = DataPipeline(cfg, load_tokenizer(cfg), rank, world)
    micro_batches = data.next_step()

The torch-free parts (sources: readers, record checks, ``demo:`` paths, DataError; tokenizer: which
tokenizer a job has) are imported eagerly; the torch parts load on first use, so that
``slidedp.validation`` can use this package in a process without torch.
"""

from slidedp.data.sources import DataError, demo_paths, resolve_data_path
from slidedp.data.tokenizer import load_tokenizer, tokenizer_source

_TORCH_NAMES = {
    "DataPipeline": "slidedp.data.pipeline",
    "MicroBatch": "slidedp.data.pipeline",
    "build_rows": "slidedp.data.pipeline",
    "epoch_order": "slidedp.data.pipeline",
    "attention_mask_from_segments": "slidedp.data.packing",
}

__all__ = [
    "DataError",
    "demo_paths",
    "resolve_data_path",
    "load_tokenizer",
    "tokenizer_source",
    *_TORCH_NAMES,
]


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        import importlib

        return getattr(importlib.import_module(_TORCH_NAMES[name]), name)
    raise AttributeError(f"module 'slidedp.data' has no attribute {name!r}")
