"""A timeline of a rank's steps, for finding where the host updater and the compute stream wait.

Off unless SLIDEDP_TRACE names a folder: each rank then writes `trace-rank{R}.jsonl` there at the end of its run
(`trace-rank{R}-2.jsonl` and so on where an earlier run in the same folder wrote one: a bench of several policies
keeps each run's timeline), one event per line, every time in seconds on one clock (the host's perf_counter, from
the trace's start):

  {"kind": "run", "compiled", "activations", "layer_forward_flops"}
                                                         how the run's layers ran: compiled or eager, and each
                                                         decoder layer's activations (keep / offload / checkpoint);
                                                         one layer's forward over one micro-batch in FLOPs,
                                                         {"matmul", "attention"} (model_sizing.layer_forward_flops)

  {"kind": "step", "step", "t"}                          the main thread begins the step
  {"kind": "gpu", "step", "start", "forward_end", "backward_end"}
                                                         when the compute stream reached those points (CUDA events
                                                         placed on the host clock through one event recorded on an
                                                         idle device at the trace's start)
  {"kind": "backward_issued", "step", "t"}               the main thread has issued the step's last backward
  {"kind": "wait_update", "step", "unit", "t0", "t1"}    the main thread waited for the unit's last update before
                                                         delivering it
  {"kind": "wait_slot", "step", "unit", "t0", "t1"}      ... for a free gradient staging slot
  {"kind": "update", "step", "unit", "t0", "landed", "t1"}
                                                         the updater took the unit's gradient (t0), had it (the copy
                                                         had landed and every rank's part was there), and was done
  {"kind": "final", "step", "unit", "t0", "t1", "offcpu"} with clipping: the weights pass of the update after the
                                                         global norm (the unit is updated for the next forward at
                                                         t1), and the seconds of it the updater spent off its CPU
                                                         (waiting at the update team's barrier or for the GIL)
  {"kind": "moments", "step", "unit", "t0", "t1", "offcpu"}
                                                         ... the same update's moments pass, after every unit's
                                                         weights pass
  {"kind": "updates_issued", "step", "t"}                the main thread has issued the step's updates on the GPU
                                                         (streamed and device-updated units) and returns to its loop
  {"kind": "layer", "step", "mb", "dir", "unit", "act", "ready", "end"}
                                                         on the compute stream, one decoder layer's forward or
                                                         backward (dir) in micro-batch mb: `ready` once the stream
                                                         had what it waits for before the layer (its weights
                                                         delivered, a free gradient buffer) and the work queued ahead
                                                         of it, `end` once the layer's kernels were done; a layer's
                                                         own time is end - ready, the time the stream spent before
                                                         it (waits, the work between two layers) ready - the
                                                         previous layer's end

Only the first MAX_STEPS steps are kept. The cost of a disabled trace is one attribute test per event site.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

MAX_STEPS = 64

TRACE: Trace | None = None  # the rank's trace, or None (the default): set by `start`


class Trace:
    def __init__(self, path: str):
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._gpu: list[tuple[int, dict[str, Any]]] = []
        self._layers: list[tuple[dict[str, Any], Any, Any]] = []
        self._ref = None
        self._ref_t = 0.0
        self.t_origin = time.perf_counter()

    def anchor(self, streams: Any) -> None:
        """Put the device's clock on the host's: one timing event recorded on an idle device."""
        import torch

        if streams.cuda:
            torch.cuda.synchronize(streams.device)
        self._ref = streams.record(streams.compute, timing=True)
        if streams.cuda:
            self._ref.synchronize()
        self._ref_t = time.perf_counter()

    def wanted(self, step: int) -> bool:
        return step <= MAX_STEPS

    def add(self, kind: str, step: int, **fields: Any) -> None:
        if self.wanted(step):
            self.events.append({"kind": kind, "step": step, **fields})  # list.append: safe across threads

    def gpu(self, step: int, events: dict[str, Any]) -> None:
        if self.wanted(step) and self._ref is not None:
            self._gpu.append((step, {k: events[k] for k in ("start", "forward_end", "backward_end") if k in events}))

    def run(self, compiled: bool, activations: list[str], layer_forward_flops: tuple[float, float]) -> None:
        matmul, attention = layer_forward_flops
        self.events.append({"kind": "run", "step": 0, "compiled": compiled, "activations": list(activations),
                            "layer_forward_flops": {"matmul": matmul, "attention": attention}})

    def layer(self, step: int, mb: int, direction: str, unit: int, act: str, ready: Any, end: Any) -> None:
        """A decoder layer's forward or backward between two timing events on the compute stream."""
        self._layers.append(({"kind": "layer", "step": step, "mb": mb, "dir": direction, "unit": unit, "act": act},
                             ready, end))

    def _on_host_clock(self, ev: Any) -> float:
        return self._ref_t + self._ref.elapsed_time(ev) / 1e3

    def write(self) -> str:
        """Resolve the device events (their steps are over) and write the file; returns its path."""
        rows = list(self.events)
        for step, evs in self._gpu:
            evs_done = {k: v for k, v in evs.items() if getattr(v, "query", lambda: True)()}
            rows.append({"kind": "gpu", "step": step, **{k: self._on_host_clock(v) for k, v in evs_done.items()}})
        for row, ready, end in self._layers:
            if self._ref is not None and ready.query() and end.query():
                rows.append({**row, "ready": self._on_host_clock(ready), "end": self._on_host_clock(end)})
        origin = self.t_origin
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as fh:
            for r in rows:
                out = {k: (round(v - origin, 6) if k in ("t", "t0", "t1", "landed", "start", "forward_end",
                                                         "backward_end", "ready", "end") else v) for k, v in r.items()}
                fh.write(json.dumps(out) + "\n")
        return self.path


def start(rank: int) -> Trace | None:
    """The rank's trace when SLIDEDP_TRACE names a folder, else None."""
    global TRACE
    folder = os.environ.get("SLIDEDP_TRACE", "").strip()
    TRACE = Trace(_free_path(folder, rank)) if folder else None
    return TRACE


def _free_path(folder: str, rank: int) -> str:
    """trace-rank{R}.jsonl in folder, or the first of trace-rank{R}-2.jsonl, -3, ... that no run wrote yet (each
    rank of a run counts its own files, so the ranks of one run agree)."""
    path, n = os.path.join(folder, f"trace-rank{rank}.jsonl"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(folder, f"trace-rank{rank}-{n}.jsonl")
    return path


def now() -> float:
    return time.perf_counter()
