"""Time to first step: how long `slidedp.train()` takes from its call to the first step's record, for a preset
(random initial weights) or a local Hugging Face directory (loaded weights), and which start-up stages it went to.

    PYTHONPATH=runtime python3 scripts/first_step.py --model qwen3-8b [--gpus 1] [--gpu-memory-gib 60]
    PYTHONPATH=runtime python3 scripts/first_step.py --write-hf /data/qwen3-8b-bf16 --model qwen3-8b
    PYTHONPATH=runtime python3 scripts/first_step.py --model /data/qwen3-8b-bf16
    PYTHONPATH=runtime python3 scripts/first_step.py --fill-bound --model qwen3-8b

The run: `--steps` (2) steps of one micro-batch of `--seq` (2048) random token ids (a jsonl this script writes;
token ids need no tokenizer), no export, no checkpoints. It prints the start-up stages and, last, one JSON line.

--write-hf DIR writes a preset's random initial weights (those a run of the preset with --seed starts from) as a
Hugging Face directory of bf16 safetensors shards of about 5 GB with config.json and the index, as real
checkpoints come; unit by unit, never the whole model in fp32.

--fill-bound times the floor under building the host state: creating shared-memory files (where the host state
lives) of the bytes the fill writes (the fp32 master and the bf16 delivery copy, by the runtime's own layout) and
writing every page once, on every core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator

HF_SHARD_BYTES = 5 * 10**9  # what Hugging Face checkpoints of 8B models come in
GB = 10**9


def job_config(model: str, data: str, out_dir: str, gpus: int = 1, seq: int = 2048, steps: int = 2,
               gpu_memory_gib: float | None = None, cpu_threads: int | None = None,
               delivery_cast: str | None = None, compiled_layers: bool | None = None) -> dict:
    """The measured job: one micro-batch of seq tokens per step, no export, no checkpoints, the policy planned."""
    cfg = {"model": model, "data": {"path": data, "format": "tokens", "shuffle": False}, "seq_len": seq,
           "micro_batch_size": 1, "steps": steps, "gpus": gpus, "precision": "bf16", "output_dir": out_dir,
           "export": False, "checkpoint": {"interval": 0}, "schedule": {"warmup_steps": 0, "decay": "constant"}}
    if gpu_memory_gib:
        cfg["gpu_memory_gib"] = gpu_memory_gib
    if cpu_threads:
        cfg["cpu_threads"] = cpu_threads
    if delivery_cast:
        cfg["policy"] = {"delivery_cast": delivery_cast}
    if compiled_layers is not None:
        cfg.setdefault("policy", {})["compiled_layers"] = compiled_layers
    return cfg


def write_tokens(path: str, rows: int, seq: int, vocab: int) -> str:
    """A jsonl of `rows` rows of seq random token ids below vocab (as `slidedp bench --data random` writes)."""
    from slidedp.bench import _rows, _write

    _write(path, _rows("random", rows, seq, vocab))
    return path


def time_first_step(cfg: dict, on_log=None) -> dict:
    """Run the job; the seconds from the train() call to the first step's record as this script sees them, the
    runtime's own figure and stage durations from that record, and the whole call's wall time."""
    from slidedp.launch import train

    seen: dict = {"losses": []}

    def on_step(record: dict) -> None:
        seen["losses"].append(record.get("loss"))
        if "moments_paged_s" in record:  # the first record, or a later one where the paging outlasted step 1
            seen["moments_paged_s"] = record["moments_paged_s"]
        if "first_step_s" not in seen:
            seen["first_step_s"] = time.perf_counter() - t0
            seen["record"] = record

    t0 = time.perf_counter()
    result = train(cfg, on_step=on_step, on_log=on_log)
    wall = time.perf_counter() - t0
    record = seen.get("record") or {}
    return {"model": cfg["model"], "gpus": cfg["gpus"], "seq": cfg["seq_len"], "steps": result.steps_done,
            "time_to_first_step_s": round(seen["first_step_s"], 3) if "first_step_s" in seen else None,
            "runtime_time_to_first_step_s": record.get("time_to_first_step_s"),
            "startup_s": record.get("startup_s"), "moments_paged_s": seen.get("moments_paged_s"),
            "rank_startup_s": record.get("rank_startup_s"), "startup_parts_s": record.get("startup_parts_s"),
            "first_step_time_s": record.get("step_time_s"),
            "train_wall_s": round(wall, 3), "status": result.status, "losses": seen["losses"]}


def _initial_units(adapter, seed: int, ahead: int) -> Iterator:
    """Each unit's random initial weights (fp32, ModelAdapter.init_unit), in unit order, drawn up to `ahead`
    units in advance on as many threads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    def draw(spec):
        flat = torch.empty(spec.numel)
        adapter.init_unit(spec, flat, seed)
        return flat

    specs = iter(adapter.units)
    with ThreadPoolExecutor(max(1, ahead)) as pool:
        pending: deque = deque(pool.submit(draw, s) for _, s in zip(range(max(1, ahead)), specs))
        while pending:
            flat = pending.popleft().result()
            spec = next(specs, None)
            if spec is not None:
                pending.append(pool.submit(draw, spec))
            yield flat


def write_hf_dir(out_dir: str, model: str, seed: int = 0, shard_bytes: int = HF_SHARD_BYTES,
                 threads: int | None = None) -> dict:
    """Write preset `model`'s random initial weights (seed) as a Hugging Face directory of bf16 safetensors
    (slidedp.persist.export.write_hf: config.json, shards, model.safetensors.index.json). Returns write_hf's dict."""
    from slidedp.config import is_model_path
    from slidedp.persist.export import write_hf
    from slidedp.step.host_fill import fill_threads, torch_threads
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    if is_model_path(model):
        raise SystemExit(f"--write-hf takes a preset (--model qwen3-8b), not the directory {model!r}")
    adapter = ModelAdapter(load_hf_config(model))
    # a few units ahead: the draws overlap the writes, and at most `ahead` + 1 units are held in fp32
    ahead = threads or min(fill_threads(len(adapter.units)), 8)
    with torch_threads(1 if ahead > 1 else os.cpu_count() or 1):
        return write_hf(out_dir, model, "bf16", adapter, _initial_units(adapter, seed, ahead),
                        shard_bytes=shard_bytes)


def fill_bound(model: str, threads: int | None = None) -> dict:
    """Seconds to create shared-memory files of the bytes the host state's fill writes (fp32 master, bf16
    delivery copy, as slidedp.step.layout lays them out) and write each page once, on `threads` threads (default:
    every core); the files are removed after."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from slidedp.policy import ExecutionPolicy
    from slidedp.step.host_fill import available_cores, torch_threads
    from slidedp.step.layout import plan_layout
    from slidedp.step.model_adapter import ModelAdapter, load_hf_config

    adapter = ModelAdapter(load_hf_config(model))
    policy = ExecutionPolicy.from_shorthand("replicated:host", adapter.num_layers)
    layout = plan_layout([u.numel for u in adapter.units], 1, policy, "bf16", clip=False,
                         run=f"slidedp-fillbound-{os.getpid()}")
    threads = threads or available_cores()
    kinds = [("master", torch.float32)] + ([("delivery", torch.bfloat16)] if layout.delivery_dtype == "bfloat16"
                                           else [])
    os.makedirs(layout.directory, exist_ok=True)
    paths = [layout.path(kind) + ".bound" for kind, _ in kinds]
    try:
        t0 = time.perf_counter()
        jobs = []
        for path, (_, dtype) in zip(paths, kinds):
            with open(path, "wb") as fh:
                fh.truncate(layout.total * torch.empty((), dtype=dtype).element_size())
            flat = torch.from_file(path, shared=True, size=layout.total, dtype=dtype)
            step = -(-layout.total // threads)
            jobs += [flat[a : a + step] for a in range(0, layout.total, step)]
        with torch_threads(1), ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda t: t.fill_(1.0), jobs))
        seconds = time.perf_counter() - t0
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
    written = layout.total * (4 + (2 if len(kinds) == 2 else 0))
    state = layout.parts()["master_and_moments"] + layout.parts()["delivery_copy"]
    return {"model": model, "params": layout.total, "threads": threads, "directory": layout.directory,
            "bytes_written": written, "state_bytes": state, "fill_bound_s": round(seconds, 3),
            "gb_per_s": round(written / GB / seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="preset name or local Hugging Face directory")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--gpu-memory-gib", type=float, default=None, help="the job's gpu_memory_gib cap")
    ap.add_argument("--cpu-threads", type=int, default=None, help="the job's cpu_threads")
    ap.add_argument("--delivery-cast", choices=("host", "gpu"), default=None,
                    help="the job's policy.delivery_cast (gpu: no bf16 copy in host memory, 2 B/param less)")
    ap.add_argument("--compiled-layers", choices=("auto", "true", "false"), default="auto",
                    help="the job's policy.compiled_layers (auto: the planner's choice)")
    ap.add_argument("--out", default=None, help="output_dir of the run (default: a temporary folder)")
    ap.add_argument("--write-hf", metavar="DIR", default=None,
                    help="write --model (a preset) as a Hugging Face directory of bf16 safetensors, then exit")
    ap.add_argument("--seed", type=int, default=0, help="with --write-hf: the initial weights' seed")
    ap.add_argument("--fill-bound", action="store_true",
                    help="time creating and writing the host state's bytes in shared memory, then exit")
    ap.add_argument("--threads", type=int, default=None, help="threads of --fill-bound / --write-hf")
    args = ap.parse_args(argv)
    if args.gpus < 0 or args.seq < 1 or args.steps < 1:
        ap.error("--gpus must be 0 or more, --seq and --steps 1 or more")

    if args.write_hf:
        t0 = time.perf_counter()
        written = write_hf_dir(args.write_hf, args.model, args.seed, threads=args.threads)
        size = sum(f["bytes"] for f in written["files"])
        print(json.dumps({"write_hf": written["final_dir"], "bytes": size, "files": len(written["files"]),
                          "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
        return 0
    if args.fill_bound:
        print(json.dumps(fill_bound(args.model, args.threads)), flush=True)
        return 0

    from slidedp.step.model_adapter import load_hf_config

    vocab = load_hf_config(args.model).vocab_size
    with tempfile.TemporaryDirectory(prefix="slidedp-first-step-") as tmp:
        data = write_tokens(os.path.join(tmp, "tokens.jsonl"), max(4, args.steps * max(1, args.gpus)), args.seq, vocab)
        cfg = job_config(args.model, data, args.out or os.path.join(tmp, "out"), args.gpus, args.seq, args.steps,
                         args.gpu_memory_gib, args.cpu_threads, args.delivery_cast,
                         None if args.compiled_layers == "auto" else args.compiled_layers == "true")
        row = time_first_step(cfg, on_log=lambda line: print("   ", line, flush=True))
    for stage, seconds in (row["startup_s"] or {}).items():
        print(f"{stage:>22}  {seconds:8.2f} s")
    print(f"{'time to first step':>22}  {row['time_to_first_step_s']:8.2f} s", flush=True)
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
