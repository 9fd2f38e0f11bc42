"""Random initialisation takes every seed the config accepts (0 … 2^63 − 1): the largest used to overflow torch's
64-bit generator seed when a preset's units were initialised."""

from __future__ import annotations

import torch
from slidedp.step.model_adapter import ModelAdapter, load_hf_config


def _unit(seed: int) -> torch.Tensor:
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    spec = adapter.units[1]
    flat = torch.empty(spec.numel)
    adapter.init_unit(spec, flat, seed)
    return flat


def test_the_largest_seed_initialises_and_differs_from_seed_zero():
    big = _unit(2**63 - 1)
    assert torch.isfinite(big).all() and not torch.equal(big, _unit(0))
