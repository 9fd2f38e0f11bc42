"""The order the host updater takes gradients in (slidedp.step.optimizer.Updater._next_item)."""

from __future__ import annotations

import threading
from collections import deque

from slidedp.step.optimizer import GradItem, Updater


class _Copy:
    def __init__(self, landed: bool) -> None:
        self.landed = landed

    def query(self) -> bool:
        return self.landed


def _updater(items: list[GradItem], ended: set[int], slots: int = 8) -> Updater:
    up = object.__new__(Updater)  # only the queue: no host state, no thread
    up._cond, up._pending, up._backward_ended = threading.Condition(), deque(items), ended
    up._empty_steps, up._stopping = deque(), False
    up.slots = slots
    return up


def test_after_the_backward_the_lowest_landed_gradient_comes_first_and_none_landed_takes_the_first_handed():
    """Once the backward is over, units go in forward order so that the next forward's first units are ready
    first, but only among gradients whose copy has landed: waiting on a copy still under way (the lowest unit's
    is the last issued) would idle the updater while others are ready."""
    items = [GradItem(seq, 1, unit, seq % 8, _Copy(landed)) for seq, (unit, landed) in
             enumerate([(30, True), (20, True), (10, False)])]
    up = _updater(items, ended={1})
    assert up._next_item().unit == 20
    items[2].event.landed = True
    assert up._next_item().unit == 10
    for it in items:
        it.event.landed = False
    assert up._next_item().unit == 30  # none landed: the first handed over, whose copy lands first
    items[2].published = True  # seen landed before (announced to the other ranks)
    assert up._next_item().unit == 10


def test_the_lowest_order_takes_the_lowest_landed_gradient_during_the_backward_unless_a_slot_is_needed():
    """During the backward too the updater takes the lowest unit whose copy has landed, so
    that what is left when the backward ends is spread up to the top layers and the next forward does not run
    its upper layers after the updater has gone idle. When one of the backward's next two handoffs would wait for
    the oldest gradient's staging slot (slots are a ring), it takes the oldest instead."""
    items = [GradItem(seq, 1, unit, seq % 8, _Copy(landed)) for seq, (unit, landed) in
             enumerate([(30, True), (29, True), (28, True), (27, False)], start=1)]
    up = _updater(items, ended=set(), slots=8)
    assert up._next_item().unit == 28  # 27's copy is still under way
    items[3].event.landed = True
    assert up._next_item().unit == 27
    for it in items:
        it.event.landed = False
    assert up._next_item().unit == 30  # none landed: the first handed over
    # seq 1 (unit 30) is the oldest; with the newest at seq 7 the next handoff (8) still has a slot free,
    # but seq 9 would need seq 1's slot: the oldest goes first
    more = [GradItem(seq, 1, 30 - seq + 1, seq % 8, _Copy(True)) for seq in range(1, 8)]
    assert _updater(more, ended=set(), slots=8)._next_item().unit == 30
    assert _updater(more[:6], ended=set(), slots=8)._next_item().unit == 25


def test_a_steps_update_busy_time_includes_its_last_unit_with_its_off_cpu_part():
    """The step's result is made once its last unit's busy time is counted: it was made inside that unit's
    processing, so the unit's busy time went to the next step while its off-CPU part stayed in this one, and a
    step could report more time off the CPU than busy (seen in CI: update_offcpu 2.6 ms > update_busy 1.4 ms)."""
    import time

    from slidedp.step.optimizer import Updater

    up = object.__new__(Updater)
    up.threads, up.clip, up.host_units, up._done_units = None, False, [1], 0
    up._waited = up._busy = up._offcpu = up._cast = 0.0
    seen: list[tuple[float, float]] = []
    up._wait_moments = lambda: None
    up._next_item = iter([GradItem(1, 1, 1, 1, _Copy(True)), None]).__next__

    def process(item):
        time.sleep(0.05)
        up._offcpu += 0.04  # as _update_unit counts it: a part of this unit's busy time
        up._done_units += 1

    up._process = process
    up._finish_step = lambda step: seen.append((up._busy, up._offcpu))
    up.error = None
    Updater.run(up)
    assert up.error is None and len(seen) == 1
    busy, offcpu = seen[0]
    assert busy >= 0.05 and offcpu <= busy
