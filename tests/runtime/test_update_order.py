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


def _updater(items: list[GradItem], ended: set[int]) -> Updater:
    up = object.__new__(Updater)  # only the queue: no host state, no thread
    up._cond, up._pending, up._backward_ended = threading.Condition(), deque(items), ended
    up._empty_steps, up._stopping = deque(), False
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
    during = _updater(items, ended=set())  # during the backward: in the order handed over
    assert during._next_item().unit == 30
