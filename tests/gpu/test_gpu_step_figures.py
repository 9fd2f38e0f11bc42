"""On GPUs: the metrics record's per-GPU memory figures (docs/interfaces.md §3) come from the card: the allocator's
peak, the driver's count and the allocator's retries during each step. Run on the GPU machine:
`PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch
from slidedp.launch import train

from tests.runtime.exactness import make_pattern_data, tiny_job

pytestmark = pytest.mark.gpu


def test_each_step_reports_the_allocators_retries_per_gpu(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    result = train(tiny_job(data, str(tmp_path / "out"), steps=3, gpus=1))
    for record in result.metrics:
        assert len(record["hbm_peak_gib"]) == 1 and record["hbm_peak_gib"][0] > 0
        retries = record["alloc_retries"]
        assert len(retries) == 1 and isinstance(retries[0], int) and retries[0] >= 0
    # a tiny model on a whole card never runs the allocator short
    assert sum(r["alloc_retries"][0] for r in result.metrics) == 0
