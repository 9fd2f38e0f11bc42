"""Does a decoder layer slow down when it runs for as long as a step does? Calibration times a layer's forward and
backward in short bursts (8 pairs after one warm-up); inside a whole-card step the layers run back to back for
seconds. This times the same kept forward + backward pair (slidedp.planning.model_bench.ModelParts.layer_calls, as
calibration does) back to back for --seconds, each pair with CUDA events, and samples the GPU's SM clock, power and temperature
(nvidia-smi) once a second beside it; then prints the burst median (the first pairs, as calibration sees them), the
median of each later second, and the clocks.

    PYTHONPATH=runtime python3 scripts/probe_layer_sustained.py --model qwen3-8b --mbs 8 --seq 2048 --seconds 20 \
        [--compiled] --out sustained.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time

import torch
from slidedp.planning.microbench import median_time
from slidedp.planning.model_bench import ModelParts
from slidedp.presets import model_config_dict


def sample_clocks(stop: threading.Event, out: list[dict]) -> None:
    """nvidia-smi's SM clock (MHz), power (W) and temperature (C) of GPU 0, once a second until stop."""
    t0 = time.perf_counter()
    while not stop.is_set():
        try:
            line = subprocess.run(
                ["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout.strip()
            sm, power, temp, reasons = [x.strip() for x in line.split(",")]
            out.append({"t": time.perf_counter() - t0, "sm_mhz": float(sm), "power_w": float(power),
                        "temp_c": float(temp), "throttle": reasons})
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            out.append({"t": time.perf_counter() - t0, "error": str(exc)})
        stop.wait(1.0)


def pairs(model: str, mbs: int, seq: int, seconds: float, compiled: bool) -> dict:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    parts = ModelParts(model_config_dict(model), device, torch.bfloat16)
    calls = parts.layer_calls(mbs, seq, compiled)  # as calibration times it (unit, or unit_compiled)
    for _ in range(3):  # warm-up (the compile, for a compiled layer)
        calls.keep_fwd()
        calls.keep_bwd()
    torch.cuda.synchronize()

    def run() -> None:
        calls.keep_fwd()
        calls.keep_bwd()

    clocks: list[dict] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_clocks, args=(stop, clocks), daemon=True)
    sampler.start()
    times, stamps = [], []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        times.append(median_time(run, 1, True, warmup=0))  # one pair, timed with CUDA events
        stamps.append(time.perf_counter() - t0)
    stop.set()
    sampler.join()
    per_second: dict[int, list[float]] = {}
    for t, s in zip(times, stamps):
        per_second.setdefault(int(s), []).append(t)
    return {
        "model": model, "mbs": mbs, "seq": seq, "compiled": compiled,
        "burst_median_s": statistics.median(times[:8]),
        "per_second_median_s": {k: statistics.median(v) for k, v in sorted(per_second.items())},
        "last_half_median_s": statistics.median(times[len(times) // 2:]),
        "pairs": len(times),
        "clocks": clocks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = pairs(a.model, a.mbs, a.seq, a.seconds, a.compiled)
    short = {k: v for k, v in res.items() if k != "clocks"}
    print(json.dumps(short, indent=1))
    sm = [c["sm_mhz"] for c in res["clocks"] if "sm_mhz" in c]
    if sm:
        print(f"SM clock: first {sm[0]:.0f} MHz, min {min(sm):.0f}, last {sm[-1]:.0f}; power max "
              f"{max(c['power_w'] for c in res['clocks'] if 'power_w' in c):.0f} W")
    if a.out:
        with open(a.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
