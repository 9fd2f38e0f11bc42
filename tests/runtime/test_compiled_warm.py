"""A rank compiles its layers before the first step (slidedp.step.compiled.warm, called while the launcher fills
the host state): the engine's own calls that follow — a kept layer under its saved-tensor hooks, its backward, a
checkpointed layer's forward without a graph and its recompute — find every graph compiled, so the first step
compiles nothing. Guards are the same for every backend, so the CPU's aot_eager shows what inductor would do."""

import os

import pytest
import torch
from slidedp.step.compiled import layer_function, warm

from scripts import layer_profile

MODEL = "tiny-qwen3"


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engines_calls_after_warm_compile_nothing(dtype):
    torch._dynamo.reset()
    mbs, seq = 2, 16
    layer = layer_profile.build_layer(MODEL, mbs, seq, torch.device("cpu"), dtype)
    # the position ids as the data pipeline hands them over: int64, contiguous
    pos = torch.arange(seq).expand(mbs, seq).contiguous()
    layer.ctx["position_ids"] = pos
    layer.ctx["position_embeddings"] = layer.adapter.rotary(torch.device("cpu"))(layer.h, pos)
    before = graphs()
    warm(layer.adapter, torch.device("cpu"), dtype, mbs, seq)
    warmed = graphs()
    assert warmed > before  # warm compiled something
    layer.engine.layer_fn = layer_function(layer.adapter, True, torch.device("cpu"))  # the engine's, as it is made
    for policy in ("keep", "checkpoint"):
        saved = layer_profile._forward(layer, policy)
        layer_profile._backward(layer, saved)
    assert graphs() == warmed


def test_without_warm_the_same_calls_compile():
    """The check above can fail: the same calls on a fresh adapter compile their graphs in the step."""
    torch._dynamo.reset()
    layer = layer_profile.build_layer(MODEL, 2, 16, torch.device("cpu"), torch.float32)
    layer.engine.layer_fn = layer_function(layer.adapter, True, torch.device("cpu"))
    before = graphs()
    for policy in ("keep", "checkpoint"):
        layer_profile._backward(layer, layer_profile._forward(layer, policy))
    assert graphs() > before


def test_the_compile_cache_lives_beside_the_calibrations(tmp_path, monkeypatch):
    """Compiled kernels are kept with this host's calibrations (a workbench's own folder), not under /tmp where a
    reboot loses them; a TORCHINDUCTOR_CACHE_DIR the user set is kept."""
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    monkeypatch.setenv("SLIDEDP_CACHE_DIR", str(tmp_path / "cal"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    adapter = ModelAdapter(load_hf_config(MODEL))
    layer_function(adapter, False, torch.device("cpu"))
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # eager layers compile nothing
    layer_function(adapter, True, torch.device("cpu"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cal" / "compiled")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    layer_function(adapter, True, torch.device("cpu"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
