"""On 2 GPUs (1 where the machine has one): delivery_cast gpu (fp32 master copied into a device scratch buffer and cast there, on the copy
stream) trains the same bits as the host's bf16 copy, and moves twice the bytes host->device.
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_delivery_cast.py`."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import test_delivery_cast as cast

pytestmark = pytest.mark.gpu


def test_gpu_cast_trains_the_same_bits_as_the_host_copy(tmp_path):
    gpus = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 0
    if not gpus:
        pytest.skip("needs a GPU")
    runs = cast.cast_runs(tmp_path, gpus=gpus)
    cast.assert_same_bits(runs)
    cast.assert_fp32_crosses(runs)
