"""Start-up stages (slidedp.startup): train() reports each stage as it begins, progress while the host state is
filled, and the durations in the first step's record, the log and the `training` stage."""

from __future__ import annotations

import contextlib
import errno
import threading
import time

import psutil
import pytest
from slidedp.config import ConfigError
from slidedp.launch import train
from slidedp.startup import Startup

from tests.runtime.exactness import make_pattern_data, tiny_job


def test_train_reports_its_start_up_stages_in_order_with_their_durations(tmp_path, monkeypatch):
    from slidedp.planning import topology

    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    seen: list[dict] = []
    lines: list[str] = []
    detected_on: list[str] = []
    detect = topology.detect

    def recorded_detect(*args, **kwargs):
        detected_on.append(threading.current_thread().name)
        return detect(*args, **kwargs)

    monkeypatch.setattr(topology, "detect", recorded_detect)
    result = train(tiny_job(data, str(tmp_path / "out"), steps=2), on_stage=seen.append, on_log=lines.append)
    order = [e["stage"] for e in seen if "progress" not in e]
    if "calibrating" in order:  # this host had no calibration of the job's shape yet: measured, then cached
        assert order.index("calibrating") == 1
    assert [s for s in order if s != "calibrating"] == [
        "planning", "building_host_state", "starting_ranks", "first_step", "training"]
    progress = [e for e in seen if "progress" in e]
    assert progress and progress[-1]["stage"] == "building_host_state" and 0 <= progress[-1]["progress"] < 1
    assert all(e["elapsed_s"] >= 0 for e in seen)
    durations = seen[-1]["durations"]
    assert list(durations) == order[:-1] and all(v >= 0 for v in durations.values())
    assert result.metrics[0]["startup_s"] == durations and "startup_s" not in result.metrics[1]
    first = result.metrics[0]["time_to_first_step_s"]
    assert first == seen[-1]["total_s"] >= sum(durations.values()) - 0.01 and "time_to_first_step_s" not in \
        result.metrics[1]
    assert any(line.startswith("start-up took ") for line in lines)
    parts = result.metrics[0]["rank_startup_s"]  # rank 0's own start-up, part by part
    assert list(parts) == ["process_and_imports", "waiting_for_plan", "device", "process_group", "attach",
                           "page_lock_staging", "waiting_for_host_state", "page_lock", "model_and_data", "engine"]
    assert all(v >= 0 for v in parts.values()) and "rank_startup_s" not in result.metrics[1]
    assert parts["process_and_imports"] > 0.1  # a fresh interpreter imports torch
    assert any(line.startswith("rank 0 start-up: process and imports ") for line in lines)
    # The launcher's planning stage, part by part (a calibration measured here moves the parts after it into
    # `calibrating`, the stage then running).
    marked = result.metrics[0]["startup_parts_s"]
    names = [p for stage in ("planning", "calibrating") for p in marked.get(stage, {})]
    # The ranks are spawned once the host is measured, before the plan is made: they start beside it.
    assert names == ["model_config", "detecting_host", "calibration", "spawning_ranks", "plan", "removing_orphans",
                     "checks", "allocating_host_state", "sending_the_run"], marked
    assert all(v >= 0 for parts in marked.values() for v in parts.values())
    assert sum(marked["planning"].values()) <= durations["planning"] + 0.01
    assert "startup_parts_s" not in result.metrics[1]
    # The host is detected once, on a thread of its own, while the model's config is read.
    assert len(detected_on) == 1 and detected_on[0].startswith("slidedp-detect"), detected_on


def test_stages_are_named_and_progress_is_rate_limited():
    events: list[dict] = []
    s = Startup(events.append, None)
    with pytest.raises(ValueError, match="unknown start-up stage"):
        s.enter("dreaming")
    s.enter("building_host_state")
    for i in range(1000):
        s.progress(i, 1000)
    assert 1 <= len([e for e in events if "progress" in e]) <= 3  # the first at once, then every 0.5 s
    s.progress(1000, 1000)
    assert events[-1]["progress"] == 1.0
    assert set(s.finish()) == {"building_host_state"} and events[-1]["stage"] == "training"


def test_marks_split_the_running_stage_into_parts():
    s = Startup(None, None)
    s.mark("before any stage")  # nothing is running: not kept
    s.enter("planning")
    s.mark("a")
    s.mark("b")
    s.mark("a")  # a part marked twice in a stage adds up
    s.enter("building_host_state")
    s.mark("c")
    durations = s.finish()
    s.mark("after the start")  # the start is over: not kept
    parts = s.parts_s()
    assert list(parts) == ["planning", "building_host_state"]
    assert list(parts["planning"]) == ["a", "b"] and list(parts["building_host_state"]) == ["c"]
    assert sum(parts["planning"].values()) <= durations["planning"] + 1e-3


def _rank_children() -> list[psutil.Process]:
    """This process's children that run a rank (python -m slidedp.ranks ...)."""
    out = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "slidedp.ranks" in child.cmdline():
                out.append(child)
    return out


def _cpu_s(procs: list[psutil.Process]) -> float:
    """User and system CPU time of the processes (those that have exited count nothing)."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def _maps(proc: psutil.Process, path: str) -> bool:
    try:
        return any(m.path == path for m in proc.memory_maps(grouped=True))
    except psutil.Error:
        return False


def _wait_quiet(procs: list[psutil.Process], what: str, also=lambda: True) -> None:
    """Until the processes have used at most 0.1 s of CPU in a second (waiting on something) and also() holds, or
    fail with `what` after 120 s."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        before = _cpu_s(procs)
        time.sleep(1.0)
        if also() and _cpu_s(procs) - before <= 0.1:
            return
    raise AssertionError(what)


def _job(tmp_path, name: str) -> dict:
    data = make_pattern_data(str(tmp_path / "data.jsonl"), rows=16, seq_len=32)
    return {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": 32,
            "micro_batch_size": 2, "steps": 2, "ranks": 2, "precision": "fp32", "export": False,
            "output_dir": str(tmp_path / name), "optimizer": {"max_grad_norm": 0.0},
            "policy": {"delivery": "sharded", "grad_reduce": "gpu", "activations": "checkpoint", "resident_units": 0,
                       "edge_update": "host", "device_layers": 0, "delivery_cast": "host"}}


@pytest.mark.slow  # make test-fast keeps its 10 minutes; make test runs it
def test_the_ranks_start_while_the_host_state_is_filled_and_read_it_only_once_it_is_whole(tmp_path, monkeypatch):
    """A run from step 0 starts its rank processes before the host state is filled, so their start-up (imports,
    CUDA, the process group, page-locking) overlaps the fill; they must not read the state before it is whole. A
    fill held back until the ranks have attached the state and gone quiet trains the same losses as one that is
    not."""

    from slidedp import launch

    plain = train(_job(tmp_path, "plain"))
    fill = launch._init_host_state
    alive: list[psutil.Process] = []

    def slow_fill(cfg, adapter, state, *args, **kwargs):
        alive.extend(_rank_children())
        board = state.layout.path("board")
        # each rank has the state mapped and has gone quiet: waiting for the fill, or (were it not to wait) done
        # training on the zeros the state holds before it
        _wait_quiet(alive, "the ranks did not attach the host state and wait",
                    also=lambda: all(_maps(proc, board) for proc in alive))
        fill(cfg, adapter, state, *args, **kwargs)

    monkeypatch.setattr(launch, "_init_host_state", slow_fill)
    held = train(_job(tmp_path, "held"))
    assert len(alive) == 2, "the ranks were not started before the fill"
    assert [r["loss"] for r in held.metrics] == [r["loss"] for r in plain.metrics]
    assert [r["grad_norm"] for r in held.metrics] == [r["grad_norm"] for r in plain.metrics]


def test_a_fill_that_fails_ends_the_ranks_started_before_it(tmp_path, monkeypatch):
    from slidedp import launch

    def broken_fill(*args, **kwargs):
        assert _rank_children()
        raise OSError("the model's weights could not be read")

    monkeypatch.setattr(launch, "_init_host_state", broken_fill)
    with pytest.raises(OSError, match="could not be read"):
        train(_job(tmp_path, "broken"))
    assert _rank_children() == []


def test_the_ranks_are_spawned_while_the_plan_is_made_and_receive_the_run_after_it(tmp_path, monkeypatch):
    """The ranks start (interpreter, imports) as soon as the host is measured, beside AutoPolicy's search; the plan
    they receive is the one the search made."""
    from slidedp.planning import autopolicy

    plan_job = autopolicy.plan_job
    during: list[list[psutil.Process]] = []

    def watched(*args, **kwargs):
        during.append(_rank_children())
        return plan_job(*args, **kwargs)

    monkeypatch.setattr(autopolicy, "plan_job", watched)
    job = _job(tmp_path, "spawned")
    job["policy"] = {}  # every choice AutoPolicy's
    result = train(job)
    assert len(during) == 1 and len(during[0]) == 2, "the ranks were not running while the plan was made"
    assert result.status == "completed" and len(result.metrics) == 2
    assert "waiting_for_plan" in result.metrics[0]["rank_startup_s"]
    assert all(r["alloc_retries"] == [] for r in result.metrics)  # a CPU run has no allocator to retry


def test_a_refused_plan_ends_the_ranks_spawned_before_it(tmp_path, monkeypatch):
    from slidedp.planning import autopolicy

    spawned: list[list[psutil.Process]] = []

    def refused(*args, **kwargs):
        spawned.append(_rank_children())
        return {"feasible": False, "errors": [{"loc": "policy", "msg": "refused by this test"}]}

    monkeypatch.setattr(autopolicy, "plan_job", refused)
    job = _job(tmp_path, "refused")
    job["policy"] = {}
    with pytest.raises(ConfigError, match="refused by this test"):
        train(job)
    assert spawned and len(spawned[0]) == 2
    psutil.wait_procs(spawned[0], timeout=30)
    assert _rank_children() == [] and not any(p.is_running() for p in spawned[0])


def _pages_nothing(pager) -> None:
    """MomentPager.run of a run whose fresh moments are left to the first update's page faults (the reference)."""
    assert pager.mode == "populate"  # the updaters do not wait for it


@pytest.mark.slow  # three 2-rank trainings; make test runs it
def test_fresh_moments_are_paged_in_while_the_ranks_start_and_no_update_comes_before_zeros(tmp_path, monkeypatch):
    """A run from step 0 pages in its fresh AdamW moments once, in the launcher, while the ranks start, instead of
    the first step's update faulting them in. Written as zeros (where the kernel lacks MADV_POPULATE_WRITE: its
    refusal is made here), paging held back until the ranks have run step 1's backward and gone quiet: no unit is
    updated before it ends (an update racing its zeros would lose that step's moments), and the losses and norms are
    those of a run that pages nothing. The default, populated by the kernel, does not hold the updaters back: the
    test after this one."""
    from slidedp.step import host_fill

    run = host_fill.MomentPager.run
    with monkeypatch.context() as patched:
        patched.setattr(host_fill.MomentPager, "run", _pages_nothing)
        job = {**_job(tmp_path, "plain"), "steps": 3}
        plain = train(job)
    assert "moments_paged_s" not in plain.metrics[0]
    monkeypatch.setattr(host_fill, "populate", lambda base, nbytes, advice: errno.EINVAL)
    updated_when_paged: list[int] = []

    def held(self):
        _wait_quiet(_rank_children(), "the ranks did not wait for the moments")
        board, publish = self.board, self.board.set

        def set_seen(key, value):
            # the board as it is the moment the paging says it is done, before that releases the updaters (read
            # after run() returns, a released updater may already have taken its unit)
            if key == board.MOMENTS_PAGING and value == 0:
                updated_when_paged.extend(board.updated(u, r) for u in range(board.units) for r in range(board.world))
            publish(key, value)

        board.set = set_seen
        run(self)

    monkeypatch.setattr(host_fill.MomentPager, "run", held)
    paged = train({**job, "output_dir": str(tmp_path / "paged")})
    assert updated_when_paged and set(updated_when_paged) == {0}, "a unit was updated before its moments were paged in"
    assert paged.metrics[0]["moments_paged_s"] >= 0 and "moments_paged_s" not in paged.metrics[1]
    assert [r["loss"] for r in paged.metrics] == [r["loss"] for r in plain.metrics]
    assert [r["grad_norm"] for r in paged.metrics] == [r["grad_norm"] for r in plain.metrics]


@pytest.mark.slow  # two 2-rank trainings; make test runs it
def test_populated_moments_do_not_hold_back_the_first_update_and_lose_nothing_it_wrote(tmp_path, monkeypatch):
    """The default paging (the kernel allocates the zeroed pages, MADV_POPULATE_WRITE) writes nothing, so the
    updaters do not wait for it: paging held back until a unit of step 1 has been updated still trains the losses
    and norms of a run that pages nothing (an update's moments are never overwritten)."""
    from slidedp.step import host_fill

    run = host_fill.MomentPager.run
    with monkeypatch.context() as patched:
        patched.setattr(host_fill.MomentPager, "run", _pages_nothing)
        job = {**_job(tmp_path, "plain"), "steps": 6}  # steps left after the paging: one record says how long
        plain = train(job)
    updated_before: list[int] = []

    def held(self):
        if self.mode != "populate":
            return run(self)  # a kernel without the advice: the zeros, tested above
        board = self.board
        deadline = time.monotonic() + 120
        while not any(board.updated(u, r) for u in range(board.units) for r in range(board.world)):
            assert time.monotonic() < deadline, "no unit was updated while the paging was held back"
            time.sleep(0.002)
        updated_before.extend(board.updated(u, r) for u in range(board.units) for r in range(board.world))
        run(self)

    monkeypatch.setattr(host_fill.MomentPager, "run", held)
    paged = train({**job, "output_dir": str(tmp_path / "paged")})
    if not updated_before:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert max(updated_before) >= 1, "the updaters waited for the paging"
    reported = [r["moments_paged_s"] for r in paged.metrics if "moments_paged_s" in r]
    assert len(reported) == 1 and reported[0] >= 0  # on the first record after the paging ended
    assert [r["loss"] for r in paged.metrics] == [r["loss"] for r in plain.metrics]
    assert [r["grad_norm"] for r in paged.metrics] == [r["grad_norm"] for r in plain.metrics]


def test_paging_in_the_moments_that_fails_fails_the_run_and_ends_its_ranks(tmp_path, monkeypatch):
    from slidedp.launch import TrainError
    from slidedp.step import host_fill

    def broken(self, piece):
        raise OSError("Cannot allocate memory")

    monkeypatch.setattr(host_fill.MomentPager, "page_piece", broken)
    with pytest.raises(TrainError, match="paging in the AdamW moments failed: Cannot allocate memory"):
        train(_job(tmp_path, "broken"))
    assert _rank_children() == []
