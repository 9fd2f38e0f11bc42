"""On 2 GPUs: delivery_cast gpu (fp32 master copied into a device scratch buffer and cast there, on the copy
stream) trains the same bits as the host's bf16 copy, and moves twice the bytes host->device.
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_delivery_cast.py`."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import test_delivery_cast as cast

pytestmark = pytest.mark.gpu


def test_gpu_cast_trains_the_same_bits_as_the_host_copy(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    runs = cast.cast_runs(tmp_path, gpus=2)
    cast.assert_same_bits(runs)
    cast.assert_fp32_crosses(runs)
