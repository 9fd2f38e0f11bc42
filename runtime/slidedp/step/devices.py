"""Streams and events with one interface on CUDA and on the CPU.

On CUDA the engine runs compute on the default stream and copies on one stream per direction, ordered by events
(never by device-wide synchronisation). On the CPU (gloo, development and CI) the same code runs with streams and
events that do nothing, because every operation is already complete when it returns.
"""

from __future__ import annotations

import contextlib
import time

import torch


class _NullEvent:
    """On the CPU every op has finished when it returns, so an event is just the host clock at record time."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _NullStream:
    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Streams:
    """compute (the current stream), h2d and d2h copy streams of one rank."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.h2d = torch.cuda.Stream(device)
            self.d2h = torch.cuda.Stream(device)
        else:
            self.compute = self.h2d = self.d2h = _NullStream()

    def event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing) if self.cuda else _NullEvent()

    def on(self, stream):
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def record(self, stream, timing: bool = False):
        ev = self.event(timing)
        if self.cuda:
            ev.record(stream)
        return ev
