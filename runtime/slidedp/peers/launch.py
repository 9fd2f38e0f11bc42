"""How a peer baseline runs: fresh rank interpreters joined by a file:// rendezvous, one JSON report each, one row.

A peer module (slidedp.peers.fsdp2, slidedp.peers.deepspeed_zero) describes its run as a row dict and hands it
to `run_ranks`, which starts `python -m <module> ARGS_FILE RANK WORLD` once per rank and returns the finished row.
In the rank, the module's command line calls `rank_main(args_file, rank, world, train)`; `train(args, rank,
world)` returns rank 0's measurements (see `finish` for the keys) and a failure becomes a report, not a hang.

Why fresh interpreters and not fork: CUDA and fork do not mix, and a fresh process measures the peer as a user would
run it. Why a file:// rendezvous in a private temporary directory: torch's TCPStore can listen on every interface,
and nothing here needs a port. The launching process imports no torch: a bench command or a web worker's job
process stays free of CUDA, and the host RAM the ranks need is not held by their parent.

The data contract every peer shares: rank r trains at step s on the rows `global_rows(s, r, world, mbs)` of the
given token rows (wrapping around), or of `random_rows(...)` from a fixed seed, so two peers given the same rows
train on the same global batches.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

# Set in the rank processes unless the caller already chose: NVLink multicast (NVLS) is off on the GPU machine.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}  # SlideDP's optimizer defaults
DATA_SEED = 0
INIT_SEED = 0
FAILED_RANK_GRACE_S = 10.0  # after one rank fails, the others get this long to report before they are killed
LOG_TAIL_CHARS = 3000


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
    """Run `world` ranks of `python -m module` on the run described by `row` and return the finished row.

    `row` holds the run's settings (model, gpus, mbs, seq, steps, warmup, ...); every rank reads them, plus
    init_file, out_dir and data_rows, from one JSON args file. `env` is added to every rank's environment.
    """
    name = module.rsplit(".", 1)[-1]
    with tempfile.TemporaryDirectory(prefix=f"slidedp-{name}-") as tmp:
        args = dict(row, init_file=os.path.join(tmp, "rendezvous"), out_dir=tmp, data_rows=data_rows)
        args_file = os.path.join(tmp, "args.json")
        with open(args_file, "w", encoding="utf-8") as fh:
            json.dump(args, fh)
        t0 = time.perf_counter()
        codes, timed_out = _launch_and_wait(module, args_file, world, tmp, timeout_s, env or {})
        row["wall_s"] = time.perf_counter() - t0
        reports = [_read_json(os.path.join(tmp, f"rank{r}.json")) for r in range(world)]
        logs = [_tail(os.path.join(tmp, f"rank{r}.log")) for r in range(world)]
    return finish(row, reports, codes, logs, timed_out, timeout_s)


def _rank_env(rank: int, world: int, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # the ranks must import this very slidedp, installed or not
    runtime = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = runtime + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for key, value in GPU_ENV.items():
        env.setdefault(key, value)
    # the identity a launcher such as torchrun gives each rank, for libraries that read it; no MASTER_ADDR or
    # MASTER_PORT: the rendezvous is the file
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    env.update(extra)
    return env


def _launch_and_wait(module: str, args_file: str, world: int, tmp: str, timeout_s: float,
                     extra_env: dict[str, str]) -> tuple[list[int | None], bool]:
    """Start the ranks, wait for all of them; kill the rest once one failed (they wait in a collective forever)."""
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.log"), "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module, args_file, str(r), str(world)],
                    env=_rank_env(r, world, extra_env), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        timed_out = False
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
                break
            if now > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [p.returncode for p in procs], timed_out


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


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


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
        "rss_gib": proc_status_gib("VmRSS"), "rss_peak_gib": proc_status_gib("VmHWM"),
    }


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


def join_group(a: dict, rank: int, world: int):
    """This rank's device, with the process group joined through the run's file:// rendezvous (NCCL on GPUs,
    gloo on the CPU)."""
    import torch
    import torch.distributed as dist

    init = f"file://{a['init_file']}"
    if a["gpus"] > 0:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    return device


def is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # a failure before torch was imported is no OOM, and need not wait for it
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


def rank_main(args_file: str, rank: int, world: int, train: Callable[[dict, int, int], dict]) -> NoReturn:
    """One rank: run `train`, write rank<r>.json next to the args file (also on failure), and end the process."""
    with open(args_file, encoding="utf-8") as fh:
        a = json.load(fh)
    report: dict[str, Any] = {"rank": rank}
    try:
        report.update(train(a, rank, world), status="ok")
    except Exception as exc:
        traceback.print_exc()
        report.update(status="oom" if is_oom(exc) else "error", error=f"{type(exc).__name__}: {exc}"[-2000:])
    path = os.path.join(a["out_dir"], f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    if report["status"] != "ok":
        os._exit(1)  # the other ranks may be blocked in a collective: a clean teardown would wait for them
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not a return into interpreter shutdown: destroy_process_group only unregisters a group that is still
    # held (FSDP2's DeviceMesh stays in torch's DTensor caches, and the mesh holds the group), so the gloo
    # worker threads outlive it. One may still be dropping the tensors of the last collective, which takes the
    # GIL; once finalization has begun CPython ends such a thread with pthread_exit, whose unwind through a
    # noexcept C++ destructor calls std::terminate: the rank dies with SIGABRT after writing its report.
    # What the rank leaves behind (its report, its log) is on disk; the OS ends the rest at once.
    os._exit(0)
