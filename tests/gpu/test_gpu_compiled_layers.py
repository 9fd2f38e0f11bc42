"""On GPUs: policy.compiled_layers, the decoder layers through torch.compile with inductor, under the exactness
contract of the eager layers (fp32, TF32 off) and beside the eager layers in bf16.

A keep / offload / checkpoint mix: the compiled graph's saved tensors pass through the saved-tensor hooks (weights
by reference, offloaded activations copied out and back on their streams), the checkpointed layers run the
no-grad graph and recompute through the grad graph. Dynamo recompiles once (the grad mode), never per layer.
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_compiled_layers.py`.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.gpu.test_gpu_exactness import _gpus, _no_tf32, workdir  # noqa: F401  (fixtures)
from tests.runtime import test_exactness as exact

pytestmark = pytest.mark.gpu

MIX = {"activations": "auto", "keep_layers": 1, "offload_layers": 2, "resident_units": 0, "edge_update": "host",
       "device_layers": 0}


def _recompiles(log: str) -> list[str]:
    return re.findall(r"Recompiling function (\w+)", log)


def test_gpu_compiled_layers_match_adamw_without_recompiling(workdir, monkeypatch, capfd):  # noqa: F811
    if _gpus() < 1:
        pytest.skip("needs a GPU")
    monkeypatch.setenv("TORCH_LOGS", "recompiles,graph_breaks")
    capfd.readouterr()
    ours = exact._check(workdir, "untied", 1, "replicated", "host", 2, exact.CLIP, gpus=1,
                        policy={**MIX, "compiled_layers": True})
    logged = capfd.readouterr()
    log = logged.out + logged.err
    assert ours["result"].policy.compiled_layers
    assert _recompiles(log) == ["_eager"], log[-4000:]
    assert "Graph break" not in log, log[-4000:]


BF16_STEPS = 8


def test_gpu_compiled_layers_track_the_eager_layers_in_bf16(workdir):  # noqa: F811
    """bf16: the compiled layers' loss curve within 1e-2 relative of the eager layers' (kernels fused in another
    order round bf16 differently; the fp32 test above holds the exact contract)."""
    import slidedp

    if _gpus() < 1:
        pytest.skip("needs a GPU")
    losses = {}
    for compiled in (False, True):
        out = str(workdir["root"] / f"bf16-compiled-{compiled}")
        result = slidedp.train({
            "model": workdir["untied"], "data": {"path": workdir["data"], "format": "tokens", "shuffle": False},
            "seq_len": exact.SEQ, "micro_batch_size": exact.MBS, "steps": BF16_STEPS, "gpus": 1,
            "precision": "bf16", "output_dir": out, "export": False, "cpu_threads": 4,
            "optimizer": {"lr": 1e-3, "max_grad_norm": 0.0},
            "policy": {**MIX, "compiled_layers": compiled},
        })
        assert result.status == "completed" and result.policy.compiled_layers is compiled
        losses[compiled] = [m["loss"] for m in result.metrics]
    for step, (a, b) in enumerate(zip(losses[False], losses[True], strict=True), 1):
        assert abs(a - b) <= 1e-2 * abs(a), (step, a, b)
    torch.cuda.empty_cache()
