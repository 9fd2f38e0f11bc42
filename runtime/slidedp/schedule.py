"""The order a step uses its units in, and where the working window puts each: shared by the engine's window
(slidedp.step.window) and the overlap model (slidedp.planning.overlap), so the model replays the deliveries the engine
makes. Imports no torch.

The schedule of one step: embedding, layers 1..L, head, layers L..1 for the first micro-batch, then 1..L, L..1 for
each further one (the embedding and head keep their own buffers across micro-batches). The window plan walks that
schedule `slots - 1` items ahead and evicts the buffer whose unit is needed again furthest in the future, from
the schedule alone, so every rank plans the same deliveries and all-gathers whatever the timing. A held-out
evaluation walks its own, forward-only schedule (`eval_schedule`) through the same window.
"""

from __future__ import annotations


def device_units(layers: int, edge_update: str, device_layers: int) -> frozenset[int]:
    """Units updated on the GPUs (slidedp.step.device_update): the embedding and head (units 0 and layers + 1)
    with edge_update gpu, and decoder layers 1..device_layers. None of them sends a gradient to the host."""
    out = set(range(1, 1 + min(int(device_layers or 0), layers)))
    return frozenset(out | ({0, layers + 1} if edge_update == "gpu" else set()))


def streamed_units(layers: int, device_layers: int, streamed_layers: int) -> frozenset[int]:
    """Decoder layers whose update after the norm streams through the GPUs (slidedp.step.streamed_update): the
    `streamed_layers` right after the `device_layers` updated there for good, so that the host's post-norm updates
    are of the last layers, the ones the next forward needs last. None sends a gradient to the host."""
    first = min(int(device_layers or 0), layers) + 1
    n = min(int(streamed_layers or 0), layers - first + 1)
    return frozenset(range(first, first + n))


def window_plan(schedule: list[int], dedicated: set[int], slots: int) -> tuple[list[tuple], list[int]]:
    """Mirror of slidedp.step.window.Window for one step: per schedule item, where its unit is and whether it
    is delivered, and the index of the item whose get() issues it.

    Returns (plan, issued_at): plan[k] = ("d", first_use) | ("s", slot, deliver, prev_item_in_slot, source_k).
    """
    n = len(schedule)
    plan: list[tuple] = [()] * n
    issued_at = [0] * n
    seen_dedicated: set[int] = set()
    slot_unit: list[int | None] = [None] * slots
    slot_last: list[int] = [-1] * slots
    slot_src: list[int] = [-1] * slots
    issued, released = -1, -1

    def next_use(unit: int | None, after: int) -> int:
        if unit is None:
            return 1 << 31
        for j in range(after + 1, n):
            if schedule[j] == unit:
                return j
        return 1 << 30

    def issue(j: int) -> bool:
        u = schedule[j]
        if u in dedicated:
            plan[j] = ("d", u not in seen_dedicated)
            seen_dedicated.add(u)
            return True
        for i in range(slots):
            if slot_unit[i] == u:
                plan[j] = ("s", i, False, slot_last[i], slot_src[i])
                slot_last[i] = j
                return True
        free = [i for i in range(slots) if slot_last[i] <= released]
        if not free:
            return False
        victim = max(free, key=lambda i: next_use(slot_unit[i], j))
        plan[j] = ("s", victim, True, slot_last[victim], j)
        slot_unit[victim], slot_last[victim], slot_src[victim] = u, j, j
        return True

    for k in range(n):
        horizon = min(n - 1, k + max(1, slots - 1))
        while issued < horizon and issue(issued + 1):
            issued += 1
            issued_at[issued] = k
        if issued < k:
            raise ValueError(f"a window of {slots} buffers cannot hold schedule item {k}")
        released = k
    return plan, issued_at


def step_schedule(layers: int, micro_batches: int) -> list[int]:
    """Units in the order the engine uses them: embedding, 1..L, head, L..1 (then 1..L, L..1 per micro-batch)."""
    return _schedule(layers, micro_batches, backward=True)


def eval_schedule(layers: int, micro_batches: int) -> list[int]:
    """Units in the order a forward-only evaluation uses them: embedding, 1..L, head, then 1..L per further
    micro-batch (the embedding and head keep their own buffers across micro-batches, as in a step)."""
    return _schedule(layers, micro_batches, backward=False)


def _schedule(layers: int, micro_batches: int, backward: bool) -> list[int]:
    sched: list[int] = []
    for m in range(micro_batches):
        if m == 0:
            sched.append(0)
        sched.extend(range(1, layers + 1))
        if m == 0:
            sched.append(layers + 1)
        if backward:
            sched.extend(range(layers, 0, -1))
    return sched
