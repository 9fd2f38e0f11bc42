"""A host-state segment larger than HostLayout.stripe_bytes lives in several files mapped back to back into one
range: filling one file on many cores waits on that file's page allocation (4.9 GB/s against 16-24 GB/s for 16
files on the one-GPU machine). The striped segment must read and write as one flat tensor, across processes."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from slidedp.step import host_fill
from slidedp.step import layout as layout_mod
from slidedp.step.host_state import HostLayout, HostState, unlink
from slidedp.step.model_adapter import ModelAdapter, load_hf_config

PAGE = os.sysconf("SC_PAGE_SIZE")


def _layout(tmp_path, name: str, stripe: int) -> HostLayout:
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    return HostLayout(run=f"slidedp-stripes-{name}-{os.getpid()}", directory=str(tmp_path / "shm"),
                      unit_numels=[u.numel for u in adapter.units], world=1, delivery_dtype="bfloat16",
                      staging_slots=2, hold_gradient=True, stripe_bytes=stripe)


def test_a_striped_segment_is_one_tensor_over_its_files_in_order_and_another_mapping_sees_it(tmp_path):
    layout = _layout(tmp_path, "map", 4 * PAGE)
    os.makedirs(layout.directory)
    state = HostState.create(layout)
    try:
        n = layout.total
        files = layout.files("master", 4 * n)
        assert len(files) == -(-4 * n // (4 * PAGE)) > 2 and all(size == 4 * PAGE for _, size in files[:-1])
        assert not os.path.exists(layout.path("master"))
        values = torch.arange(n, dtype=torch.float32)
        state.master.copy_(values)
        on_disk = b"".join(open(path, "rb").read() for path, _ in files)
        assert torch.equal(torch.frombuffer(bytearray(on_disk), dtype=torch.float32), values)
        other = HostState.attach(layout)  # as a rank maps it
        assert torch.equal(other.master, values)
        other.exp_avg[-3:] = 7.0  # written through one mapping, read through the other: the same pages
        assert state.exp_avg[-3:].tolist() == [7.0] * 3 and not state.exp_avg[:-3].any()
        segments = [p for p in glob.glob(layout.path("*")) if not p.endswith(".manifest.json")]
        assert state.shared_bytes() == sum(os.path.getsize(p) for p in segments)
        del other
    finally:
        unlink(layout)
    assert glob.glob(os.path.join(layout.directory, layout.run + ".*")) == []  # every stripe removed


def _mapped(path: str) -> bool:
    with open("/proc/self/maps", encoding="utf-8") as fh:
        return any(line.rstrip().endswith(path) or line.rstrip().endswith(path + " (deleted)") for line in fh)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_a_striped_segment_is_unmapped_once_its_tensors_are_gone(tmp_path):
    """Unlinked shared-memory files keep their memory while mapped: a striped state must be unmapped when the
    last tensor over it goes, or every run in a process (a benchmark's rows) would keep its state's RAM."""
    import gc

    layout = _layout(tmp_path, "unmap", 4 * PAGE)
    os.makedirs(layout.directory)
    state = HostState.create(layout)
    first = layout.files("master", 4 * layout.total)[0][0]
    view = state.master[10:20]
    try:
        assert _mapped(first)
        del state
        gc.collect()
        assert _mapped(first), "unmapped while a view of it was alive"
        view.fill_(1.0)
        del view
        gc.collect()
        assert not _mapped(first)
    finally:
        unlink(layout)


def test_a_stripe_size_that_is_not_whole_pages_is_refused(tmp_path):
    with pytest.raises(ValueError, match="stripe_bytes must be a positive multiple of the page size"):
        _layout(tmp_path, "bad", PAGE + 8)


def test_the_pager_takes_its_pieces_from_one_stripe_after_another(monkeypatch):
    monkeypatch.setattr(host_fill, "PAGE_CHUNK", 4)  # elements: 16 bytes a piece
    a, b = torch.zeros(32), torch.zeros(32)  # 128 bytes each: two stripes of 64 bytes
    board = type("B", (), {"MOMENTS_PAGING": 7, "set": lambda self, k, v: None})()
    pager = host_fill.MomentPager([a, b], board, threads=1, mode="zero", stripe_bytes=64)
    order = [(0 if t is a else 1, lo) for t, lo, _ in pager.pieces]
    assert sorted(order) == [(i, lo) for i in (0, 1) for lo in range(0, 32, 4)]
    stripes = [(i, lo * 4 // 64) for i, lo in order]
    assert stripes[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # each of the four files before any file again


@pytest.mark.slow  # two 2-rank trainings; make test runs it
def test_training_on_a_striped_host_state_is_the_same_as_on_one_file_per_segment(tmp_path, monkeypatch):
    from slidedp.launch import train

    from tests.runtime.exactness import HOST_ROUTE_FEW_SLOTS, make_pattern_data, tiny_job

    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("SLIDEDP_SHM_DIR", str(shm))
    plain = train(tiny_job(data, str(tmp_path / "plain"), steps=3, ranks=2, policy=HOST_ROUTE_FEW_SLOTS))
    monkeypatch.setattr(layout_mod, "STRIPE_BYTES", 4 * PAGE)
    seen: list[int] = []
    striped = train(tiny_job(data, str(tmp_path / "striped"), steps=3, ranks=2, policy=HOST_ROUTE_FEW_SLOTS),
                    on_step=lambda record: seen.append(len(glob.glob(str(shm / "*.master.*")))))
    assert seen and min(seen) > 2, "the state was not striped"
    assert [r["loss"] for r in striped.metrics] == [r["loss"] for r in plain.metrics]
    assert [r["grad_norm"] for r in striped.metrics] == [r["grad_norm"] for r in plain.metrics]
    assert os.listdir(shm) == []
