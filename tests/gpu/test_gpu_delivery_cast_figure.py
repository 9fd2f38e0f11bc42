"""On a GPU: calibration's `delivery_cast` figure (slidedp.planning.microbench.delivery_cast) times a decoder layer's
delivery through the engine's own Routes, alone and beside the layer's forward, by transfer chunk and through the
cast scratch, and the figures it records are the ones the cost model reads (cost_model.Rates.cast_figure).
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_delivery_cast_figure.py`."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_the_delivery_cast_is_timed_alone_and_beside_the_layers_forward():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from slidedp.planning.microbench import CAST_CHUNKS_MB, CAST_MAX_FORWARDS, CAST_RING_MB, delivery_cast
    from slidedp.planning.model_bench import ModelParts
    from slidedp.presets import model_config_dict

    dev = torch.device("cuda", 0)
    parts = ModelParts(model_config_dict("qwen3-1.7b"), dev, torch.bfloat16)
    calls = parts.layer_calls(4, 1024)
    fig = delivery_cast(dev, calls.params, calls.ckpt_fwd, reps=3)
    assert fig["params"] == calls.params and fig["bytes"] == 4 * calls.params
    assert fig["chunk_mib"] == list(CAST_CHUNKS_MB) and fig["ring_mib"] == CAST_RING_MB
    for f in [*fig["default"], fig["ring"]]:
        # a PCIe or NVLink-C2C link: between 5 and 1000 GB/s alone; beside the compute never much faster than alone
        assert fig["bytes"] / 1000e9 < f["alone_s"] < fig["bytes"] / 5e9, f
        assert f["beside_s"] > 0.9 * f["alone_s"], f
        assert 1 <= f["forwards"] <= CAST_MAX_FORWARDS
    print({"forward_s": fig["forward_s"], "default": fig["default"], "ring": fig["ring"]})
