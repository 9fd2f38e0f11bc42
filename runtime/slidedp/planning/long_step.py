"""A long step, predicted from two short replays of the overlap model (planning/overlap.py). Imports no torch.

A long step is not replayed micro-batch by micro-batch: between its first micro-batch (which waits for the previous
step's updates) and its last (which hands the gradients over) every micro-batch runs the same program on the same
resources, so past a short transient each adds the same time to every measure of the step. The pattern repeats
every two micro-batches at most (a layer's backward alternates between two gradient buffers, so with an odd number
of layers consecutive micro-batches use opposite buffers). A step of more than EXACT_MICRO_BATCHES is therefore
replayed at two lengths of its parity, SAMPLE_MICRO_BATCHES apart by two, and extended along their difference
(`steady_samples`): the replay's work no longer grows with grad_accum, and the prediction equals the full replay's
to rounding (tests/runtime/test_plan_work.py). The bound counts the window's deliveries the same way
(planning/bound.py).
"""

from __future__ import annotations

from dataclasses import replace

from slidedp.planning.overlap import SHARING_ROUNDS, Durations, Outcome, replay

EXACT_MICRO_BATCHES = 32  # a step of up to this many micro-batches is replayed in full
# A longer one is replayed at 8 or 9 micro-batches and two more: the extension is exact to rounding from 4 on
# the two-H200 fixtures and the CPU demo; 8 leaves room for a longer transient.
SAMPLE_MICRO_BATCHES = 8


def steady_samples(micro_batches: int) -> tuple[int, int, int] | None:
    """For a step too long to replay in full: (a, a + 2, n), the two step lengths replayed and how many times
    their difference is added to the shorter's; a has the step's parity. None: replay the step as it is."""
    if micro_batches <= EXACT_MICRO_BATCHES:
        return None
    a = SAMPLE_MICRO_BATCHES + (micro_batches - SAMPLE_MICRO_BATCHES) % 2
    return a, a + 2, (micro_batches - a) // 2


def simulate(d: Durations, iterations: int = SHARING_ROUNDS) -> Outcome:
    """The second of two replayed steps; a long step extended from two shorter ones (steady_samples)."""
    samples = steady_samples(d.micro_batches)
    if samples is None:
        return replay(d, iterations)
    a, b, n = samples
    short = replay(replace(d, micro_batches=a), iterations)
    longer = replay(replace(d, micro_batches=b), iterations)

    def extend(x: float, y: float) -> float:
        return x + n * (y - x)

    def extend_all(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: extend(x.get(k, 0.0), y.get(k, 0.0)) for k in {**x, **y}}

    return Outcome(
        step_time_s=extend(short.step_time_s, longer.step_time_s),
        phases=extend_all(short.phases, longer.phases),
        busy=extend_all(short.busy, longer.busy),
        tasks=short.tasks + n * (longer.tasks - short.tasks),
        spans=extend_all(short.spans, longer.spans),
        replayed=short.replayed + longer.replayed,
    )
