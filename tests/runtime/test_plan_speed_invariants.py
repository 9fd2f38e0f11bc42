"""Planning is fast without changing what it predicts: the overlap model (planning/overlap.py) counts each task's
unplaced deps instead of walking them, keeps the updater's handed-over tasks instead of filtering every task it
holds, and slows only the tasks that load a shared pool; each replay must still give the outcome the plain walk
gave, to the last digit.

The fixture (tests/runtime/fixtures/plan_speed_replays.json) holds inputs of the model (Durations, as
cost_model.durations built them for five shapes: one H200 with Qwen3-8B on the whole card and Qwen3-4B clipped under
24 GiB, two H200s without P2P and over NVLink, the CPU demo; the plans' own policies and variants of them: offloaded
layers, more staging slots, a resource made free, a long step) and what long_step.simulate gave for each before the
model was made faster. Nothing is timed: the outcomes are compared, and the work is counted."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from slidedp.config import JobConfig
from slidedp.planning import autopolicy as ap
from slidedp.planning import long_step, overlap

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "plan_speed_replays.json")


def _cases() -> list[dict]:
    with open(FIX) as fh:
        return json.load(fh)["cases"]


def _durations(saved: dict) -> overlap.Durations:
    return overlap.Durations(**{**saved, "zero": frozenset(saved["zero"])})


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_a_replay_gives_the_outcome_saved_before_the_model_was_made_faster(case):
    outcome = long_step.simulate(_durations(case["durations"]))
    assert dataclasses.asdict(outcome) == case["simulated"]  # every field, exactly


def test_a_replay_placed_again_places_every_task_where_it_did(monkeypatch):
    """run() is called once per slowdown round on the same tasks: whatever it keeps between rounds (the deps each
    task still waits for, the updater's handed-over tasks) is reset, so a second run with the same durations
    places every task at the same start and end, behind the same task."""
    for case in _cases():
        rep = overlap._Replay(_durations(case["durations"]))
        rep.run()
        first = [(t.start, t.end, None if t.binding is None else t.binding.order) for t in rep.tasks]
        rep.run()
        assert [(t.start, t.end, None if t.binding is None else t.binding.order) for t in rep.tasks] == first


def test_replays_share_no_state(one_h200, monkeypatch):
    """Each replay of a plan gives, alone in a fresh process state, what it gave inside the search: no replay leaves
    anything behind for the next (the queues' end marker is shared by all of them and never placed)."""
    topo, cals = one_h200
    seen: list[tuple[overlap.Durations, overlap.Outcome]] = []
    real = long_step.replay

    def kept(d: overlap.Durations, iterations: int = overlap.SHARING_ROUNDS) -> overlap.Outcome:
        out = real(d, iterations)
        seen.append((d, out))
        return out

    monkeypatch.setattr(long_step, "replay", kept)
    cfg = JobConfig.from_dict({"model": "qwen3-4b", "data": {"path": "x.jsonl"}, "gpus": 1, "micro_batch_size": 4,
                               "seq_len": 2048, "gpu_memory_gib": 24, "optimizer": {"max_grad_norm": 1.0}})
    plan = ap.plan_job(cfg, topo, cals["calibration_qwen3-4b_bs4"])
    monkeypatch.undo()
    assert plan["feasible"] and len(seen) > 20
    for d, out in reversed(seen[::7]):  # in another order than the search's
        assert overlap.replay(d) == out
    assert overlap._NEVER_READY.start is None and overlap._NEVER_READY.waiting == 1


def test_the_drain_looks_at_each_queue_head_once_per_pass(monkeypatch):
    """The work of placing is counted, not timed: a task is placed once per run, and a drain pass looks at most
    at one blocked head per in-order resource, so the look-ups stay within tasks + passes x resources."""
    case = next(c for c in _cases() if "whole card: the plan's policy" in c["name"])
    rep = overlap._Replay(_durations(case["durations"]))
    placed, passes = [0], [0]
    real_place, real_drain = overlap._place, overlap._Replay._drain

    def place(t, prev, deps):
        placed[0] += 1
        real_place(t, prev, deps)

    def drain(self):
        passes[0] += 1
        return real_drain(self)

    monkeypatch.setattr(overlap, "_place", place)
    monkeypatch.setattr(overlap._Replay, "_drain", drain)
    rep.run()
    assert placed[0] == len(rep.tasks)  # every task once, the updater's and the in-order resources' alike
    assert 0 < passes[0] <= 2 * len(rep.tasks)


def resave(path: str = FIX) -> None:
    """Write the outcomes the current model gives for the saved inputs: only for a change meant to change what the
    overlap model predicts (say so in its commit), never to make this test pass after a speed-up."""
    with open(path) as fh:
        data = json.load(fh)
    for case in data["cases"]:
        case["simulated"] = dataclasses.asdict(long_step.simulate(_durations(case["durations"])))
    with open(path, "w") as fh:
        json.dump(data, fh, separators=(",", ":"))
