"""Does a decoder layer's compute slow down while both PCIe directions copy? Inside a step the layers' backward runs
while the next layers' weights come in and their gradients go out; the step timelines show the layers' backward at
1.01-1.06x the time calibration measured with the card otherwise idle (docs/notebook/prediction-check-2026-12-04.md).
This times the same calls calibration times (slidedp.planning.model_bench.ModelParts.layer_calls: a kept layer's
forward + backward pair, a checkpointed layer's recompute + backward) in alternating rounds, alone and with
host-to-device and device-to-host copies of page-locked buffers queued on two streams of their own for longer than
the round, and prints each call's median both ways, their ratio and the copies' rate.

    PYTHONPATH=runtime python3 scripts/probe_layer_copies.py --model qwen3-4b --mbs 4 --seq 2048 [--compiled] \
        [--rounds 6] [--reps 8] [--out copies.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from slidedp.planning.microbench import event_times
from slidedp.planning.model_bench import ModelParts
from slidedp.presets import model_config_dict

CHUNK = 256 << 20  # bytes per queued copy


class Copies:
    """Page-locked host buffers and device buffers, one pair per direction, and the streams that copy them."""

    def __init__(self, device: torch.device):
        self.h_in = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
        self.h_out = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
        self.d_in = torch.empty(CHUNK, dtype=torch.uint8, device=device)
        self.d_out = torch.empty(CHUNK, dtype=torch.uint8, device=device)
        self.s_in, self.s_out = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def queue(self, seconds: float, gbps: float) -> tuple[torch.cuda.Event, torch.cuda.Event, int]:
        """Copies for about `seconds` at `gbps` per direction queued on both streams; returns the events around
        them and the bytes per direction."""
        n = max(1, int(seconds * gbps * 1e9 / CHUNK))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.s_in):
            a.record()
            for _ in range(n):
                self.d_in.copy_(self.h_in, non_blocking=True)
        with torch.cuda.stream(self.s_out):
            for _ in range(n):
                self.h_out.copy_(self.d_out, non_blocking=True)
            self.s_out.wait_stream(self.s_in)
            b.record()
        return a, b, n * CHUNK


def probe(model: str, mbs: int, seq: int, compiled: bool, rounds: int, reps: int) -> dict:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    parts = ModelParts(model_config_dict(model), device, torch.bfloat16)
    calls = parts.layer_calls(mbs, seq, compiled)

    def pair() -> None:
        calls.keep_fwd()
        calls.keep_bwd()

    named = {"keep_pair": pair, "checkpoint_backward": calls.ckpt_bwd}
    for _ in range(3):
        pair()
        calls.ckpt_bwd()
    copies = Copies(device)
    a, b, nbytes = copies.queue(0.2, 50.0)  # the link's rate alone, both directions at once
    b.synchronize()
    alone_gbps = 2 * nbytes / (a.elapsed_time(b) / 1e3) / 1e9
    out: dict = {"model": model, "mbs": mbs, "seq": seq, "compiled": compiled, "copies_alone_GBps": alone_gbps}
    for name, fn in named.items():
        one = statistics.median(event_times(fn, 3))
        quiet, busy, rates = [], [], []
        for _ in range(rounds):
            torch.cuda.synchronize()
            quiet += event_times(fn, reps)
            a, b, nbytes = copies.queue(1.5 * reps * one, alone_gbps / 2)
            busy += event_times(fn, reps)
            b.synchronize()
            rates.append(2 * nbytes / (a.elapsed_time(b) / 1e3) / 1e9)
        q, w = statistics.median(quiet), statistics.median(busy)
        out[name] = {"alone_s": q, "with_copies_s": w, "ratio": w / q, "copies_GBps": statistics.median(rates)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = probe(a.model, a.mbs, a.seq, a.compiled, a.rounds, a.reps)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
