"""On GPUs: a run stopped with a save and resumed equals the uninterrupted run bit for bit, in deterministic mode.

The scenario of tests/runtime/test_checkpoint.py (shuffled data crossing epochs, cosine schedule, clipping that
fires, stop part-way with a save, resume) on 2 GPUs with NCCL (on 1 where the machine has one), the Qwen3-0.6B shape in bf16, `deterministic: true`.
What is compared: the final fp32 master weights and both AdamW moments (bytes), the data position, and every step's
loss, gradient norm, learning rate and clip decision. Without deterministic mode GPU kernels are not bit-reproducible
run to run, so only this mode promises equality (docs/interfaces.md §8).
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_resume.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime import test_checkpoint as resume

pytestmark = pytest.mark.gpu

GPU_VARIANT = {"model": "qwen3-0.6b", "ranks": 1, "precision": "bf16", "deterministic": True,
               "cpu_threads": 8}


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    gpus = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 0
    if not gpus:
        pytest.skip("needs a GPU")
    return resume.stop_and_resume(tmp_path_factory.mktemp("gpu-resume"), {**GPU_VARIANT, "gpus": gpus})


def test_gpu_resume_is_bit_exact_in_deterministic_mode(gpu_runs):
    resume.assert_resume_bit_exact(gpu_runs)
