"""What the issuing thread does when a step's backward is issued (slidedp.step.engine.RankEngine._end_backward).

Queuing the streamed layers' updates (slidedp.step.streamed_update) is a few hundred copies and kernels, 20-60 ms of
the issuing thread in every clipped step timeline kept (docs/results, `backward_issued` to `updates_issued`). The
host updater must learn that the backward is over, and the compute stream get the device updates, before that, or
both wait it out after the norm; the updater must not finish the step before the streamed events are known."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest
from slidedp.step import trace
from slidedp.step.engine import RankEngine
from slidedp.step.optimizer import Updater


class _Streams:
    compute = "compute"

    def record(self, stream, timing=False):
        return f"event-{stream}"


class _Recorder:
    """Stands in for the updater, the routes, the device update and the streamed update, logging the calls."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.norm_on_device, self.clip = True, True

    def end_backward(self, step, norm=None, streamed_pending=False):
        self.log.append(f"updater.end_backward(pending={streamed_pending})")

    def add_streamed(self, step, events):
        self.log.append(f"updater.add_streamed({sorted(events)})")

    def finish_norm(self, pinned, keep=None):
        self.log.append("routes.finish_norm")
        if keep is not None:
            keep()
        return "norm-event"

    def keep_norm(self):
        self.log.append(f"{self.name}.keep_norm")

    def update(self, step):
        self.log.append(f"{self.name}.update")
        return {5: "back-5", 6: "back-6"} if self.name == "streamed" else None


def _engine(log: list[str], streamed: bool = True, device: bool = True) -> RankEngine:
    eng = object.__new__(RankEngine)  # only what _end_backward reads
    eng.streams = _Streams()
    eng.updater = _Recorder(log, "updater")
    eng.routes = _Recorder(log, "routes")
    eng.device_update = _Recorder(log, "device") if device else None
    eng.streamed = _Recorder(log, "streamed") if streamed else None
    eng._norm_host = ["host-0", "host-1"]
    return eng


def test_the_updater_and_the_device_updates_come_before_the_streamed_layers_are_queued(monkeypatch):
    monkeypatch.setattr(trace, "TRACE", None)
    log: list[str] = []
    ev: dict = {}
    norm = _engine(log)._end_backward(3, ev)
    assert norm == ("norm-event", "host-1")
    assert log == ["routes.finish_norm", "device.keep_norm", "streamed.keep_norm",
                   "updater.end_backward(pending=True)", "device.update", "streamed.update",
                   "updater.add_streamed([5, 6])"]
    assert ev["backward_end"] == "event-compute"  # recorded again after the device update


def test_without_streamed_layers_nothing_is_left_pending(monkeypatch):
    monkeypatch.setattr(trace, "TRACE", None)
    log: list[str] = []
    _engine(log, streamed=False)._end_backward(3, {})
    assert log == ["routes.finish_norm", "device.keep_norm", "updater.end_backward(pending=False)", "device.update"]


class _Event:
    def __init__(self) -> None:
        self.synced = False

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synced = True


class _Board:
    def __init__(self) -> None:
        self.updated: list[tuple[int, int]] = []

    def set_updated(self, unit, rank, step):
        self.updated.append((unit, step))


def _updater() -> Updater:
    up = object.__new__(Updater)  # the streamed bookkeeping only: no host state, no thread
    up._cond, up._backward_ended, up._device_norm = threading.Condition(), set(), {}
    up._streamed, up._empty_steps, up.host_units = {}, deque(), [0, 1]
    up._waited, up.abort, up.rank, up.board = 0.0, None, 0, _Board()
    return up


def test_the_step_is_not_finished_before_the_streamed_events_are_known(monkeypatch):
    monkeypatch.setattr(trace, "TRACE", None)
    up = _updater()
    up.end_backward(4, ("norm", "host"), streamed_pending=True)
    up._mark_streamed(4, block=False)  # between the host's own units: nothing known yet, nothing marked
    assert up.board.updated == []
    events = {2: _Event(), 3: _Event()}
    done = threading.Event()

    def finish():
        up._mark_streamed(4, block=True)
        done.set()

    t = threading.Thread(target=finish, daemon=True)
    t.start()
    time.sleep(0.2)
    assert not done.is_set(), "the step finished before its streamed updates were queued"
    up.add_streamed(4, events)
    assert done.wait(5.0)
    assert up.board.updated == [(2, 4), (3, 4)] and all(e.synced for e in events.values())
    assert 4 not in up._streamed


@pytest.mark.parametrize("pending", [False, True])
def test_a_step_without_streamed_units_finishes(monkeypatch, pending):
    monkeypatch.setattr(trace, "TRACE", None)
    up = _updater()
    up.end_backward(4, ("norm", "host"), streamed_pending=pending)
    if pending:
        up.add_streamed(4, {})
    up._mark_streamed(4, block=True)
    assert up.board.updated == [] and 4 not in up._streamed
