"""Filling the host state on several threads (slidedp.step.host_fill) writes the bytes the one-thread fill writes,
random or loaded; fresh moments are zeros nobody wrote; a checkpoint is read in parallel chunks with the delivery
copy made in the same pass; the delivery copy's page-locked ranges follow unit and page boundaries."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import torch
from slidedp.persist import checkpoint as ckpt
from slidedp.step import host_fill
from slidedp.step.host_state import MADV_POPULATE_WRITE, HostLayout, HostState, pin_ranges, unlink
from slidedp.step.model_adapter import ModelAdapter, load_hf_config


def _state(tmp_path, adapter, name: str, delivery: str = "bfloat16") -> HostState:
    layout = HostLayout(run=f"slidedp-fill-{name}-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[u.numel for u in adapter.units], world=1, delivery_dtype=delivery,
                        staging_slots=2, hold_gradient=False)
    return HostState.create(layout)


def _serial_master(adapter, seed: int) -> torch.Tensor:
    """The weights as one unit after the other draws them, without any host state."""
    return torch.cat([_drawn(adapter, spec, seed) for spec in adapter.units])


def _drawn(adapter, spec, seed):
    flat = torch.empty(spec.numel)
    adapter.init_unit(spec, flat, seed)
    return flat


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-qwen3-tied"])
def test_parallel_random_fill_is_bit_identical_to_the_serial_fill(tmp_path, model):
    adapter = ModelAdapter(load_hf_config(model))
    serial, parallel = _state(tmp_path, adapter, "serial"), _state(tmp_path, adapter, "parallel")
    try:
        host_fill.fill_host_state(adapter, serial, seed=11, threads=1)
        host_fill.fill_host_state(adapter, parallel, seed=11, threads=4)
        expected = _serial_master(adapter, 11)
        assert torch.equal(serial.master, expected) and torch.equal(parallel.master, expected)
        assert torch.equal(parallel.delivery, expected.to(torch.bfloat16))
        assert torch.equal(serial.delivery, parallel.delivery)
        other = _state(tmp_path, adapter, "other-seed")
        host_fill.fill_host_state(adapter, other, seed=12, threads=4)
        assert not torch.equal(other.master, expected)
        unlink(other.layout)
    finally:
        unlink(serial.layout)
        unlink(parallel.layout)


def test_fp32_delivery_is_the_master_and_gets_no_copy(tmp_path):
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    state = _state(tmp_path, adapter, "fp32", delivery="float32")
    try:
        host_fill.fill_host_state(adapter, state, seed=3, threads=3)
        assert state.delivery is state.master and torch.equal(state.master, _serial_master(adapter, 3))
    finally:
        unlink(state.layout)


def test_parallel_load_equals_serial_load_of_a_sharded_directory(tmp_path):
    from scripts.first_step import write_hf_dir

    model_dir = str(tmp_path / "hf")
    write_hf_dir(model_dir, "tiny-qwen3-tied", seed=5, shard_bytes=50_000, threads=2)  # units span shards
    adapter = ModelAdapter(load_hf_config(model_dir))
    serial, parallel = _state(tmp_path, adapter, "load-1"), _state(tmp_path, adapter, "load-4")
    try:
        host_fill.fill_host_state(adapter, serial, seed=0, model_dir=model_dir, threads=1)
        host_fill.fill_host_state(adapter, parallel, seed=0, model_dir=model_dir, threads=4)
        expected = _serial_master(ModelAdapter(load_hf_config("tiny-qwen3-tied")), 5).to(torch.bfloat16)
        assert torch.equal(serial.master, parallel.master)
        assert torch.equal(parallel.master, expected.float()) and torch.equal(parallel.delivery, expected)
    finally:
        unlink(serial.layout)
        unlink(parallel.layout)


def test_fresh_moments_read_as_zeros_without_being_written(tmp_path):
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    layout = HostLayout(run=f"slidedp-fill-reused-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[u.numel for u in adapter.units], world=1, delivery_dtype="bfloat16",
                        staging_slots=2, hold_gradient=False)
    os.makedirs(layout.directory)
    for kind in ("exp_avg", "exp_avg_sq"):  # a killed run's files under the same name hold old values
        with open(layout.path(kind), "wb") as fh:
            fh.write(b"\x7f" * (4 * layout.total))
    state = HostState.create(layout)
    try:
        assert state.fresh
        host_fill.fill_host_state(adapter, state, seed=0, threads=2)
        for kind in ("exp_avg", "exp_avg_sq"):
            assert not getattr(state, kind).any()
            assert os.stat(layout.path(kind)).st_blocks == 0  # a hole: not one page written
        assert os.stat(layout.path("master")).st_blocks > 0
        kept = HostState(layout, create=True, keep_state=True)  # a StateCache run maps the state as it is
        assert not kept.fresh and torch.equal(kept.master, state.master)
    finally:
        unlink(layout)


def test_parallel_for_reports_progress_from_the_calling_thread_only(monkeypatch):
    monkeypatch.setattr(host_fill, "PROGRESS_POLL_S", 0.05)
    caller, calls, ran = threading.get_ident(), [], []

    def work(item):
        time.sleep(0.06)
        ran.append((item, threading.get_ident()))

    host_fill.parallel_for(range(8), work, threads=2,
                           progress=lambda done, total: calls.append((done, total, threading.get_ident())))
    assert sorted(i for i, _ in ran) == list(range(8)) and caller not in {t for _, t in ran}
    assert calls[0][:2] == (0, 8) and len(calls) >= 3
    assert all(t == caller and 0 <= d < 8 and total == 8 for d, total, t in calls)
    assert [d for d, _, _ in calls] == sorted(d for d, _, _ in calls)


def test_parallel_for_raises_the_first_error_and_restores_torch_threads():
    before = torch.get_num_threads()
    started = []

    def work(item):
        started.append(item)
        if item == 1:
            raise ValueError("unit 1 is broken")
        time.sleep(0.05)

    with pytest.raises(ValueError, match="unit 1 is broken"):
        host_fill.parallel_for(range(50), work, threads=2)
    assert len(started) < 50 and torch.get_num_threads() == before


def test_fill_threads_follow_the_cores_and_the_work():
    assert host_fill.fill_threads(38, cores=16) == 16
    assert host_fill.fill_threads(6, cores=16) == 6
    assert host_fill.fill_threads(200, cores=256) == host_fill.MAX_THREADS
    assert host_fill.fill_threads(0, cores=2) == 1
    assert 1 <= host_fill.fill_threads(1000) <= host_fill.available_cores()


def test_checkpoint_reads_in_parallel_chunks_and_makes_the_delivery_copy_in_the_same_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "_CHUNK", 10_000)  # several chunks per array
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    state = _state(tmp_path, adapter, "ckpt")
    try:
        values = torch.randn(state.layout.total)
        path = str(tmp_path / "master.f32")
        values.numpy().tofile(path)
        seen = []
        ckpt._read_array(path, state.master, lambda a, b: seen.append((a, b)))
        assert torch.equal(state.master, values)
        assert sorted(seen) == [(a, min(a + 10_000, values.numel())) for a in range(0, values.numel(), 10_000)]
        ckpt._read_array(path, state.master, ckpt._delivery_copy(state))
        assert torch.equal(state.delivery, values.to(torch.bfloat16))
        assert ckpt._delivery_copy(_state(tmp_path, adapter, "fp32", "float32")) is None
        with open(path, "ab") as fh:
            fh.write(b"\0\0\0\0")
        with pytest.raises(Exception, match="the model needs"):
            ckpt._read_array(path, state.master)
    finally:
        unlink(state.layout)


def test_load_weights_leaves_the_moments_of_a_fresh_state_alone(tmp_path, monkeypatch):
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    state = _state(tmp_path, adapter, "init-from")
    try:
        source = tmp_path / "step-00000003"
        source.mkdir()
        values = torch.randn(state.layout.total)
        values.numpy().tofile(str(source / "master.f32"))
        (source / "meta.json").write_text('{"step": 3}')
        zeroed = []
        monkeypatch.setattr(state, "exp_avg", _Spy(state.exp_avg, zeroed))
        assert ckpt.load_weights(str(source), state, zero_moments=False) == 3
        assert zeroed == [] and torch.equal(state.master, values)
        assert ckpt.load_weights(str(source), state) == 3 and zeroed == ["zero_"]
    finally:
        unlink(state.layout)


class _Spy:
    def __init__(self, tensor, calls):
        self.tensor, self.calls = tensor, calls

    def zero_(self):
        self.calls.append("zero_")
        return self.tensor.zero_()


def test_pin_ranges_start_at_page_aligned_unit_starts_and_cover_everything():
    page = 4096
    units = [0, 3 * page, 5 * page + 2, 8 * page, 9 * page, 13 * page]  # one start is not on a page boundary
    ranges = pin_ranges(units, 16 * page, page=page, min_bytes=2 * page)
    assert ranges == [(0, 3 * page), (3 * page, 8 * page), (8 * page, 13 * page), (13 * page, 16 * page)]
    assert pin_ranges(units, 16 * page, page=page, min_bytes=64 * page) == [(0, 16 * page)]
    assert pin_ranges([0], 10, page=page) == [(0, 10)]
    # the last range is never smaller than min_bytes: no tiny registration at the end
    assert pin_ranges([0, 4 * page], 5 * page + 10, page=page, min_bytes=2 * page) == [(0, 5 * page + 10)]
    assert pin_ranges([0, 4 * page], 6 * page, page=page, min_bytes=2 * page) == [(0, 4 * page), (4 * page, 6 * page)]


def _tiny_layout(run: str, directory: str, world: int = 1) -> HostLayout:
    """The host layout of tiny-qwen3 on `world` ranks, a run name made unique by this process's id."""
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    return HostLayout(run=f"{run}-{os.getpid()}", directory=directory, unit_numels=[u.numel for u in adapter.units],
                      world=world, delivery_dtype="bfloat16", staging_slots=2, hold_gradient=False)


def test_fresh_moments_are_paged_in_only_once_every_rank_has_page_locked_the_state(tmp_path):
    """Page-locking beside the paging is many times slower and lies on the way to the first step, so the pager
    waits until every rank has said it is done (Board.set_pinned) and pages nothing before."""
    layout = _tiny_layout("slidedp-fill-pinned", str(tmp_path / "shm"), world=2)
    state = HostState.create(layout)
    try:
        state.exp_avg.fill_(1.0)  # what the paging writes is zeros: anything else shows a page it has not reached
        pager = host_fill.MomentPager([state.exp_avg], state.board, threads=2, mode="zero")
        pager.start()
        state.board.set_pinned(0)
        time.sleep(0.3)  # one of two ranks pinned: nothing paged, and the updaters still wait
        assert pager.is_alive() and pager.elapsed_s is None and pager.waited_s is None
        assert bool((state.exp_avg == 1.0).all()) and state.board.get(state.board.MOMENTS_PAGING) == 1
        state.board.set_pinned(1)
        pager.join(timeout=30)
        assert not pager.is_alive() and pager.waited_s >= 0.3 and pager.elapsed_s is not None
        assert not bool(state.exp_avg.any()) and state.board.get(state.board.MOMENTS_PAGING) == 0
        halted = host_fill.MomentPager([state.exp_avg_sq], HostState.attach(layout).board, threads=2, mode="zero")
        state.board.ints[state.board._o_pinned:].zero_()  # a run that ends before its ranks pinned
        state.exp_avg_sq.fill_(1.0)
        halted.start()
        halted.close()
        assert not halted.is_alive() and halted.elapsed_s is None and bool((state.exp_avg_sq == 1.0).all())
    finally:
        unlink(layout)


def _allocated_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


def test_populating_fresh_moments_allocates_their_pages_and_keeps_what_an_update_wrote(tmp_path):
    """The default paging has the kernel allocate the moments' zeroed pages (MADV_POPULATE_WRITE) and writes
    nothing: the updaters do not wait for it (the board's flag stays 0), so a page an update wrote first keeps its
    bytes. It too starts only once every rank has page-locked the state."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path / "shm")  # st_blocks: a tmpfs counts pages
    layout = _tiny_layout("slidedp-fill-populate", shm)
    state = HostState.create(layout)
    try:
        path, nbytes = layout.path("exp_avg"), state.exp_avg.numel() * 4
        unit = state.layout.offsets[1], state.layout.offsets[2]  # an update's write before the paging
        state.exp_avg[unit[0]:unit[1]].fill_(0.5)
        before = _allocated_bytes(path)
        pager = host_fill.MomentPager([state.exp_avg], state.board, threads=2)
        if pager.mode != "populate":
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+): the pager falls back to zeros")
        assert state.board.get(state.board.MOMENTS_PAGING) == 0  # no updater waits for it
        pager.start()
        time.sleep(0.2)
        assert pager.waited_s is None and _allocated_bytes(path) <= before + 4096  # not before the page-lock
        state.board.set_pinned(0)
        pager.join(timeout=30)
        assert not pager.is_alive() and pager.error is None and pager.elapsed_s is not None
        assert _allocated_bytes(path) >= nbytes and before < nbytes  # every page allocated, none was before
        assert bool((state.exp_avg[unit[0]:unit[1]] == 0.5).all())
        assert not bool(state.exp_avg[:unit[0]].any()) and not bool(state.exp_avg[unit[1]:].any())
        assert state.board.get(state.board.MOMENTS_PAGING) == 0
    finally:
        unlink(layout)


def test_a_failed_populate_is_the_pagers_error_and_the_boards(tmp_path, monkeypatch):
    layout = _tiny_layout("slidedp-fill-enomem", str(tmp_path / "shm"))
    state = HostState.create(layout)
    try:
        pager = host_fill.MomentPager([state.exp_avg], state.board, threads=2)
        if pager.mode != "populate":
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
        calls = []

        def refused(base, nbytes, advice):
            calls.append(advice)
            return errno.EINTR if len(calls) == 1 else errno.ENOMEM  # retried once, then a real failure

        monkeypatch.setattr(host_fill, "populate", refused)
        state.board.set_pinned(0)
        pager.run()
        assert isinstance(pager.error, OSError) and pager.error.errno == errno.ENOMEM
        assert "Cannot allocate memory" in str(pager.error) and calls[:2] == [MADV_POPULATE_WRITE] * 2
        assert state.board.get(state.board.MOMENTS_PAGING) == 2 and pager.elapsed_s is None
    finally:
        unlink(layout)


def test_populate_maps_pages_another_process_wrote_into_this_ones_page_tables(tmp_path):
    """Before page-locking, a rank maps the pages the launcher wrote in bulk (host_state.populate): after it they
    are resident in this process's mapping (statm), the bytes unchanged."""
    import subprocess
    import sys

    from slidedp.step.host_state import populate

    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path), f"slidedp-populate-{os.getpid()}")
    n = 16 << 20  # 64 MB of fp32
    code = ("import sys, torch\nopen(sys.argv[1], 'wb').truncate(int(sys.argv[2]) * 4)\n"
            "torch.from_file(sys.argv[1], shared=True, size=int(sys.argv[2]), dtype=torch.float32).fill_(0.25)\n")
    subprocess.run([sys.executable, "-c", code, path, str(n)], check=True)
    try:
        page = os.sysconf("SC_PAGE_SIZE")

        def resident() -> int:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * page

        flat = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
        before = resident()
        assert populate(flat.data_ptr(), n * 4) == 0
        assert resident() - before > 0.9 * n * 4
        assert bool((flat == 0.25).all())
    finally:
        os.unlink(path)


def test_the_staging_is_registered_in_whole_slots_and_the_delivery_copy_in_whole_units(tmp_path, monkeypatch):
    """What a GPU rank page-locks (HostState.pin_staging, then pin), with cudaHostRegister recorded instead of
    made: the staging in ranges that start on slots, populated for writing; the delivery copy in ranges that start
    on units, populated for reading, or whole on one thread; each once; no populate when asked for none."""
    from slidedp.step import host_state

    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    layout = HostLayout(run=f"slidedp-fill-lock-{os.getpid()}", directory=str(tmp_path / "shm"),
                        unit_numels=[u.numel for u in adapter.units], world=2, delivery_dtype="bfloat16",
                        staging_slots=4, hold_gradient=False)
    calls: list[tuple[int, list, int, int | None]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(host_state, "_register", lambda base, ranges, threads, advice: calls.append(
        (base, ranges, threads, advice)) or [base])
    # every page-aligned start its own range, tiny as these are (the default keeps ranges to 1 GiB at least)
    monkeypatch.setattr(host_state.pin_ranges, "__defaults__", (None, 1))
    state = HostState.create(layout)
    try:
        state.pin_staging()
        state.pin()
        state.pin()
        assert [c[0] for c in calls] == [state.staging.data_ptr(), state.delivery.data_ptr()]
        (_, staging, threads, advice), (_, delivery, _, advice_d) = calls
        slot = layout.slot_numel * 4
        assert threads == 8 and advice == host_state.MADV_POPULATE_WRITE and advice_d == host_state.MADV_POPULATE_READ
        assert staging == pin_ranges([i * slot for i in range(2 * 4)], 2 * 4 * slot, min_bytes=1)
        assert delivery == pin_ranges([o * 2 for o in layout.offsets], layout.total * 2, min_bytes=1)
        state._registered.clear()
        calls.clear()
        state.pin(threads=1, populate=False)
        (_, staging, _, advice), (_, delivery, _, advice_d) = calls
        assert delivery == [(0, layout.total * 2)] and len(staging) >= 1 and advice is None and advice_d is None
    finally:
        state._registered.clear()
        unlink(layout)
