"""On a GPU: the delivery cast through a ring of scratch buffers (policy.cast_scratch_mb, slidedp.step.cast_ring)
casts every element as torch does, on units of many pieces that wrap the ring several times, while the compute
stream is busy; and a job with it trains the same bits as the host's bf16 copy.
Run on the GPU machine: `PYTHONPATH=runtime:. python3 -m pytest -m gpu tests/gpu/test_gpu_cast_ring.py`."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import test_delivery_cast as cast

pytestmark = pytest.mark.gpu

MIB = 2**20


def _gpu() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    return torch.device("cuda", 0)


@pytest.mark.parametrize("numel", [1, 4 * MIB // 4 - 3, 11 * MIB + 5])
def test_the_ring_casts_each_element_as_torch_does_while_compute_runs(numel):
    from slidedp.step.cast_ring import CastRing

    dev = _gpu()
    ring = CastRing(dev, scratch_bytes=2 * MIB, chunk_bytes=1 * MIB)  # four buffers of 0.5 MiB
    copy_stream = torch.cuda.Stream(dev)
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(3):  # the same ring for several units, as a run delivers them
        src = (torch.randn(numel) * 1e3).pin_memory()
        dst = torch.empty(numel, dtype=torch.bfloat16, device=dev)
        for _ in range(4):  # compute kernels queued ahead of the casts
            a = torch.tanh(a @ a)
        with torch.cuda.stream(copy_stream):
            ring.cast(dst, src)
            done = torch.cuda.Event()
            done.record(copy_stream)
        torch.cuda.current_stream(dev).wait_event(done)
        assert torch.equal(dst.cpu(), src.to(torch.bfloat16))
    assert len(ring.buffers) == 4


def test_a_job_with_the_ring_trains_the_same_bits_as_the_host_copy(tmp_path):
    _gpu()
    runs = cast.cast_runs(tmp_path, gpus=1, ring=True)
    cast.assert_same_bits({"host": runs["host"], "gpu": runs["ring"]})
    assert runs["ring"]["result"].policy.cast_scratch_mb == 2
