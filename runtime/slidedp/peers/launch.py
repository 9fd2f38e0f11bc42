"""How a peer baseline runs: its ranks started by slidedp.ranks (as SlideDP's own), one result each, one row.

A peer module (slidedp.peers.fsdp2, slidedp.peers.deepspeed_zero) describes its run as a row dict and hands it
to `run_ranks`, which starts `world` ranks of the module's `rank(args, link)` and returns the finished row; that
function returns rank 0's measurements (see `finish` for the keys), and a failure becomes an error row, not a hang.
The launching process imports no torch: a bench command or a web worker's job process stays free of CUDA, and the
host RAM the ranks need is not held by their parent.

The data contract every peer shares: rank r trains at step s on the rows `global_rows(s, r, world, mbs)` of the
given token rows (wrapping around), or of `random_rows(...)` from a fixed seed, so two peers given the same rows
train on the same global batches.
"""

from __future__ import annotations

import os
import queue
import statistics
import time
from collections.abc import Callable
from typing import Any

from slidedp.ranks import Launch

ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}  # SlideDP's optimizer defaults
DATA_SEED = 0
INIT_SEED = 0
FAILED_RANK_GRACE_S = 10.0  # after one rank fails, the others get this long to report before they are killed


# ---------------------------------------------------------------------------------------------- launcher side
def check_shape(steps: int, mbs: int, seq: int, warmup: int, data_rows: list[list[int]] | None) -> None:
    """Refuse a run that cannot be measured before any process starts."""
    if steps < 1 or mbs < 1 or seq < 2 or warmup < 0:
        raise ValueError(f"bad shape: steps={steps} mbs={mbs} seq={seq} warmup={warmup}")
    if data_rows is not None:
        bad = [i for i, row in enumerate(data_rows) if len(row) != seq]
        if not data_rows or bad:
            raise ValueError(f"data_rows must be non-empty rows of length seq={seq} (rows {bad[:5]} are not)")


def cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_ranks(module: str, row: dict, world: int, timeout_s: float, *, data_rows: list[list[int]] | None = None,
              env: dict[str, str] | None = None) -> dict:
    """Run `world` ranks of `module`'s `rank` function on the run described by `row`; return the finished row.

    `row` holds the run's settings (model, gpus, mbs, seq, steps, warmup, ...); every rank gets them, plus
    data_rows. `env` is added to every rank's environment.
    """
    name = module.rsplit(".", 1)[-1]
    with Launch(f"{module}:rank", world, prefix=f"slidedp-{name}-", env=env, log=True) as ranks:
        t0 = time.perf_counter()
        ranks.start(dict(row, data_rows=data_rows))
        reports, timed_out = _collect(ranks, timeout_s)
        row["wall_s"] = time.perf_counter() - t0
        logs = [ranks.log_tail(r) for r in range(world)]
    codes = [p.returncode for p in ranks.procs]
    return finish(row, reports, codes, logs, timed_out, timeout_s)


def _collect(ranks: Launch, timeout_s: float) -> tuple[list[dict | None], bool]:
    """Every rank's report ({"status": "ok", ...} or its error), until all have exited; once one failed, the
    others get FAILED_RANK_GRACE_S (they may wait in a collective forever). (reports, timed out)."""
    reports: list[dict | None] = [None] * ranks.world

    def take(kind: str, rank: int, payload: Any) -> None:
        if kind == "result":
            reports[rank] = dict(payload, status="ok")
        elif kind == "error":
            reports[rank] = {"status": "oom" if payload["oom"] else "error", "error": payload["traceback"][-2000:]}

    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while True:
        try:
            take(*ranks.get(timeout=0.1))
            continue
        except queue.Empty:
            pass
        codes = [p.poll() for p in ranks.procs]
        if all(c is not None for c in codes):
            for message in ranks.drain(0.2):
                take(*message)
            return reports, False
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
            return reports, False
        if now > deadline:
            return reports, True


def finish(row: dict, reports: list[dict | None], codes: list[int | None], logs: list[str], timed_out: bool,
           timeout_s: float) -> dict:
    """The bench row: an error row if any rank failed ("OOM" when one ran out of memory), else the measurements.

    Rank reports carry threads, times, losses, params, hbm_peak_gib, rss_gib and rss_peak_gib, optionally
    grad_norms, and `extra` (peer-specific keys copied into the row as they are). step_s is the median of the
    times after `warmup`; host RSS is summed over the ranks, HBM is rank 0's with every rank's beside it.
    """
    if any(r and r.get("status") == "oom" for r in reports):
        return dict(row, error="OOM")
    if timed_out:
        return dict(row, error=f"timed out after {timeout_s:.0f} s; rank 0 log tail:\n{logs[0]}")
    for rank, (rep, code) in enumerate(zip(reports, codes)):
        if code != 0 or rep is None or rep.get("status") != "ok":
            return dict(row, error=f"rank {rank} exited with code {code}:\n{logs[rank]}")
    r0 = reports[0]
    times = r0["times"]
    timed = times[row["warmup"]:] or times
    step_s = statistics.median(timed)
    tokens_per_s = row["mbs"] * row["seq"] * row["world"] / step_s
    row.update(
        threads=r0["threads"], step_s=step_s, times=times, tokens_per_s=tokens_per_s,
        tflops=_flops_per_token(row["model"], row["seq"]) * tokens_per_s / 1e12,
        hbm_peak_gib=r0["hbm_peak_gib"], hbm_peak_gib_ranks=[r["hbm_peak_gib"] for r in reports],
        hbm_device_used_gib=max(r.get("hbm_device_used_gib", 0.0) for r in reports),
        host_rss_gib=sum(r["rss_gib"] for r in reports),
        host_rss_peak_gib=sum(r["rss_peak_gib"] for r in reports),
        losses=r0["losses"], params=r0["params"],
    )
    if r0.get("grad_norms") is not None:
        row["grad_norms"] = r0["grad_norms"]
    row.update(r0.get("extra") or {})
    return row


def _flops_per_token(model: str, seq: int) -> float:
    from slidedp.presets import flops_per_token, model_config_dict

    try:
        return flops_per_token(model_config_dict(model), seq)
    except (KeyError, OSError, ValueError):
        return 0.0


# ---------------------------------------------------------------------------------------------- rank side
def global_rows(step: int, rank: int, world: int, mbs: int) -> list[int]:
    """Indices of the data rows rank `rank` trains on at `step`: consecutive blocks of mbs, rank-major per step."""
    start = (step * world + rank) * mbs
    return list(range(start, start + mbs))


def random_rows(n: int, seq: int, vocab: int):
    """The peer's data when none is given: n rows of seq uniform token ids from a fixed seed (a torch tensor)."""
    import torch

    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(DATA_SEED))


def data_table(a: dict, world: int, vocab: int):
    """The token rows of the run: the given data_rows, or random ones enough for every step of every rank."""
    import torch

    if a["data_rows"] is not None:
        return torch.tensor(a["data_rows"], dtype=torch.long)
    return random_rows(a["steps"] * world * a["mbs"], a["seq"], vocab)


def init_weights(model, std: float) -> None:
    """Random init as transformers does for these decoders: normal(0, std) matrices, unit norms, zero biases.

    Drawn where the parameters live when this runs (the GPU, or the host), so a GPU run and a CPU run start from
    different random weights.
    """
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)


def timed_steps(a: dict, rank: int, world: int, vocab: int, device, step: Callable[[Any], Any],
                after_step: Callable[[], None] | None = None) -> dict:
    """The peer's timed loop: `a["steps"]` optimizer steps, each `step(ids) -> loss` (forward, backward, update)
    between a device synchronize and a barrier, on this rank's rows; `after_step` runs outside the timing.

    Returns the rank's row part: step times, the loss of every global batch (mean over ranks, as SlideDP reports
    it: every row has seq tokens), threads, peak reserved HBM and host RSS.
    """
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    table = data_table(a, world, vocab)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()

    times: list[float] = []
    losses: list = []
    for k in range(a["steps"]):
        idx = torch.tensor(global_rows(k, rank, world, a["mbs"])) % table.shape[0]
        ids = table.index_select(0, idx).to(device)
        sync()
        t0 = time.perf_counter()
        loss = step(ids)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach().float())
        if after_step is not None:
            after_step()
    mean_loss = torch.stack(losses).to(device)
    dist.all_reduce(mean_loss)
    mean_loss /= world
    return {
        "threads": torch.get_num_threads(), "times": times, "losses": mean_loss.tolist(),
        "hbm_peak_gib": torch.cuda.max_memory_reserved(device) / 2**30 if cuda else 0.0,
        # the card's memory in use as the driver counts it (context and NCCL included), after the last step
        "hbm_device_used_gib": device_used_gib(device) if cuda else 0.0,
        "rss_gib": proc_status_gib("VmRSS"), "rss_peak_gib": proc_status_gib("VmHWM"),
    }


def device_used_gib(device) -> float:
    """GiB of the GPU `device` in use by every process, as the driver counts it."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30


def proc_status_gib(key: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now, VmHWM: its peak), in GiB."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 2**30
    return 0.0


def check_model(model: str) -> None:
    """A model that is neither a local directory nor a preset fails here, before the slow imports."""
    from slidedp.config import is_model_path
    from slidedp.presets import PRESETS

    if not is_model_path(model) and model not in PRESETS:
        raise KeyError(f"unknown model preset {model!r}; presets: {', '.join(PRESETS)}")


