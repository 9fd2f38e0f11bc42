"""On GPUs: the same exactness contract as on the CPU, with copies that really overlap compute.

fp32, TF32 off (the engine turns it off on CUDA), units of a few MB so that deliveries on the h2d stream and
gradient copies on the d2h stream run while layers compute: a missing event shows up as a wrong result.
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import pytest
import torch
from slidedp import presets

from tests.runtime import test_exactness as exact
from tests.runtime.exactness import make_model_dir, make_token_data

pytestmark = pytest.mark.gpu

# Wide enough that one layer's delivery (~12 MB fp32) takes longer than a kernel launch.
presets.PRESETS.setdefault("gpu-check-qwen3", presets._tiny("qwen3", hidden_size=512, intermediate_size=1536,
                                                            num_hidden_layers=6, head_dim=64, num_attention_heads=8,
                                                            num_key_value_heads=4))


@pytest.fixture(scope="module", autouse=True)
def _no_tf32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-exact")
    return {"untied": make_model_dir(str(root / "model"), "gpu-check-qwen3"),
            "data": make_token_data(str(root / "data.jsonl"), rows=2 * 2 * exact.MBS * exact.STEPS,
                                    seq_len=exact.SEQ),
            "root": root}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("delivery,grad", exact.ROUTES)
def test_gpu_routes_match_adamw(workdir, gpus, delivery, grad):
    if _gpus() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    if gpus == 1 and (delivery, grad) != exact.ROUTES[0]:
        pytest.skip("one GPU has a single route")
    exact._check(workdir, "untied", 1, delivery, grad, 1, exact.CLIP if grad == "gpu" else 0.0, gpus=gpus)
