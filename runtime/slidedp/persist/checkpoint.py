"""Host-state checkpoints: everything needed to continue a run bit-exactly.

Layout of `output_dir/checkpoints/`:

    step-00000004/
        master.f32        fp32 master weights, the host state's flat layout (units in order), little-endian
        exp_avg.f32       AdamW first moment, same layout
        exp_avg_sq.f32    AdamW second moment, same layout
        meta.json         {"format", "step", "data_state", "config", "unit_numels", "rng", "written"}

The optimizer step count is the checkpoint's step (AdamW's bias correction reads it), the learning rate is a
pure function of the step and the config, and no random numbers are drawn during training (no dropout), so the
ranks have no RNG state to keep; the launcher's torch RNG is saved anyway. `data_state` is the data pipeline's
position (epoch, row) after the checkpoint's step. The files hold exactly the bytes of the shared host state:
on a GPU host they are written from the same host memory (the GPUs hold no state of their own between steps).

`eval.keep_best` adds `best/`: the checkpoint with the lowest eval loss so far, its files hard links to that
checkpoint's (a copy where the file system has no links) plus `best.json` {"step", "eval_loss"}; it is not a
`step-N` directory, so rotation (`keep`) and resume never see it, and it stays when its step is rotated away.

Writes are atomic: everything goes into a hidden `.tmp-step-N-PID/` directory, every file is fsync-ed, the
directory is renamed into place and the parent fsync-ed. A checkpoint counts only when its meta.json exists and
its arrays have the sizes meta.json announces, so neither a leftover temporary directory nor a directory missing
files is ever resumed from, and a failed write leaves the previous checkpoints as they were. Free disk is checked
before anything is written. The last `keep` checkpoints are kept.

A checkpoint can also start another run (`init_from`): `load_weights` fills a fresh host state's master weights
from it, reading master.f32 only. Importing this module imports no torch (validation checks an init_from source
in a process without it); the functions that touch a host state import it themselves.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import TYPE_CHECKING

from slidedp.config import ConfigError, JobConfig

if TYPE_CHECKING:
    import torch

PREFIX = "step-"
TMP_PREFIX = ".tmp-" + PREFIX
BEST = "best"
TMP_BEST = ".tmp-" + BEST + "-"
FORMAT = 1
KINDS = ("master", "exp_avg", "exp_avg_sq")
_CHUNK = 64 * 2**20  # elements per read/write call: 256 MiB, written straight from the shared memory, no copy
_SLACK = 1 << 20  # meta.json and directory entries


def step_of(path: str) -> int:
    return int(os.path.basename(path.rstrip("/"))[len(PREFIX):])


def _array_path(path: str, kind: str) -> str:
    return os.path.join(path, f"{kind}.f32")


def read_meta(path: str) -> dict:
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as fh:
        return json.load(fh)


def is_complete(path: str) -> bool:
    """meta.json is readable and every array has the size it announces (meta.json is written last)."""
    try:
        meta = read_meta(path)
        expected = 4 * sum(int(n) for n in meta["unit_numels"])
        return all(os.path.getsize(_array_path(path, k)) == expected for k in KINDS)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def list_checkpoints(root: str) -> list[str]:
    """Complete checkpoints under root, oldest step first."""
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()]
    found = [os.path.join(root, n) for n in sorted(names, key=lambda n: int(n[len(PREFIX):]))]
    return [p for p in found if is_complete(p)]


def latest(root: str) -> str | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def checkpoint_bytes(num_params: int) -> int:
    return 12 * num_params


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_array(path: str, flat: torch.Tensor) -> None:
    with open(path, "wb") as fh:
        for a in range(0, flat.numel(), _CHUNK):
            fh.write(memoryview(flat[a : a + _CHUNK].numpy()).cast("B"))
        fh.flush()
        os.fsync(fh.fileno())


def _read_array(path: str, flat: torch.Tensor, then=None) -> None:
    """Read an array file into `flat` (the shared memory itself, no copy), its chunks on every core
    (slidedp.step.host_fill); then(a, b), when given, runs on elements [a, b) right after they are read, in the
    same thread, while they are in cache (the delivery copy: one pass over the master instead of two)."""
    from slidedp.step.host_fill import fill_threads, parallel_for

    expected = flat.numel() * 4
    size = os.path.getsize(path)
    if size != expected:
        raise ConfigError([{"loc": "resume", "msg": f"{path} has {size} bytes, the model needs {expected}: the "
                                                   "checkpoint belongs to another model or was cut short"}])
    with open(path, "rb") as fh:
        fd = fh.fileno()

        def read_chunk(a: int) -> None:
            buf = memoryview(flat[a : a + _CHUNK].numpy()).cast("B")
            got = 0
            while got < len(buf):  # pread at the chunk's own offset: the threads share no file position
                n = os.preadv(fd, [buf[got:]], a * 4 + got)
                if n <= 0:
                    raise OSError(f"{path}: short read at element {a}")
                got += n
            if then is not None:
                then(a, min(a + _CHUNK, flat.numel()))

        chunks = range(0, flat.numel(), _CHUNK)
        parallel_for(chunks, read_chunk, fill_threads(len(chunks)))


def _delivery_copy(state):
    """then() for _read_array of the master: the bf16 delivery copy of the elements just read (None when the
    master itself is delivered). The copy is the master rounded, exactly as the updater writes it."""
    if state.delivery is state.master:
        return None
    return lambda a, b: state.delivery[a:b].copy_(state.master[a:b])


def _remove_stale_temporaries(root: str) -> None:
    """Temporary directories of writers that are gone (a killed run) are removed; a live writer's are kept."""
    from slidedp.step.layout import pid_alive  # imports no torch

    for name in os.listdir(root):
        if not name.startswith((TMP_PREFIX, TMP_BEST)):
            continue
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def check_free_disk(root: str, num_params: int, step: int | None = None, interval: int = 1) -> None:
    """Refuse before writing anything when the checkpoint would not fit (a full disk mid-write helps nobody).
    interval: the run's checkpoint.interval, for the advice (0: this checkpoint is the run's only one)."""
    need = checkpoint_bytes(num_params) + _SLACK
    free = shutil.disk_usage(root).free
    if free < need:
        what = f"checkpoint of step {step}" if step is not None else "a checkpoint"
        if interval:
            fix = "free disk, point output_dir to a larger disk, or set checkpoint.interval to 0"
        else:
            fix = ("free disk or point output_dir to a larger disk (checkpoint.interval is 0 already: this "
                   "checkpoint, of a stop or a failed export, is the only one the run writes)")
        raise OSError(f"{what} needs {need / 2**30:.2f} GiB in {root}, only {free / 2**30:.2f} GiB free: {fix}")


class Reserve:
    """Room on the output disk kept for the one checkpoint a run with checkpoint.interval 0 may still have to
    write: the last step's, when its export fails (a full disk, most often). Without it, whatever filled the disk
    during training would take that room too and the trained state would be lost with the export.

    A file of the checkpoint's size, allocated (not sparse) when training starts and removed just before that
    checkpoint is written, or when the run ends. A run killed outright leaves it; the next run in the folder
    takes it over as it is, allocating only what it lacks."""

    NAME = ".slidedp-reserve"

    def __init__(self, output_dir: str, num_params: int):
        self.path = os.path.join(output_dir, self.NAME)
        self.bytes = checkpoint_bytes(num_params) + _SLACK
        self.held = False

    def hold(self) -> None:
        """Allocate the room; ConfigError (loc output_dir) when the disk does not have it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.bytes)
        except OSError as exc:
            os.close(fd)
            self.release()
            folder = os.path.dirname(self.path)
            free = shutil.disk_usage(folder).free
            raise ConfigError([{"loc": "output_dir", "msg": (
                f"checkpoint.interval is 0, so if the export fails the trained state is kept in a checkpoint of "
                f"the last step instead, and the run keeps room for it from the start: {self.bytes / 2**30:.2f} "
                f"GiB in {folder}, where only {free / 2**30:.2f} GiB is free ({exc.strerror or exc}); free disk "
                "or point output_dir to a larger disk")}]) from None
        os.close(fd)
        self.held = True

    def release(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.held = False


def save(root: str, step: int, cfg: JobConfig, state, data_state: dict | None, keep: int,
         room: Reserve | None = None) -> str:
    """Write the host state as checkpoint `step` under root, atomically; keep the newest `keep`. room: the
    reserve kept for this checkpoint, given back to the disk first."""
    import torch

    os.makedirs(root, exist_ok=True)
    if room is not None:
        room.release()
    check_free_disk(root, state.layout.total, step, cfg.checkpoint.interval)
    _remove_stale_temporaries(root)
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f"{TMP_PREFIX}{step:08d}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        for kind in KINDS:
            _write_array(_array_path(tmp, kind), getattr(state, kind))
        meta = {"format": FORMAT, "step": step, "data_state": data_state, "config": cfg.to_dict(),
                "unit_numels": list(state.layout.unit_numels), "rng": torch.get_rng_state().tolist(),
                "written": time.time()}
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as fh:
            json.dump(meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        old = None
        if os.path.exists(final):  # the same step written again (a resumed run): swap, never delete first
            old = os.path.join(root, f".old-{PREFIX}{step:08d}-{os.getpid()}")
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    prune(root, keep)
    return final


def prune(root: str, keep: int) -> list[str]:
    """Remove all but the newest `keep` complete checkpoints, and incomplete step directories; returns them."""
    complete = list_checkpoints(root)
    doomed = complete[: max(0, len(complete) - keep)]
    doomed += [os.path.join(root, n) for n in os.listdir(root)
               if n.startswith(PREFIX) and os.path.join(root, n) not in complete]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def clear(root: str) -> list[str]:
    """Remove every checkpoint under root (a fresh run must never resume from a previous run's state)."""
    if not os.path.isdir(root):
        return []
    gone = [os.path.join(root, n) for n in os.listdir(root)
            if n == BEST or n.startswith((PREFIX, TMP_PREFIX, TMP_BEST, ".old-"))]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def best_eval_loss(root: str) -> float | None:
    """The eval loss of the checkpoint kept as root/best, or None when there is none."""
    try:
        with open(os.path.join(root, BEST, "best.json"), encoding="utf-8") as fh:
            return float(json.load(fh)["eval_loss"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_best(root: str, path: str, eval_loss: float) -> str:
    """Make checkpoint `path` (a step-N directory under root) root/best, replacing the previous one atomically."""
    _remove_stale_temporaries(root)
    tmp = os.path.join(root, f"{TMP_BEST}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        for name in sorted(os.listdir(path)):
            src, dst = os.path.join(path, name), os.path.join(tmp, name)
            try:
                os.link(src, dst)  # the step's files are never written again: a link is a copy that costs nothing
            except OSError:
                shutil.copyfile(src, dst)
        with open(os.path.join(tmp, "best.json"), "w", encoding="utf-8") as fh:
            json.dump({"step": step_of(path), "eval_loss": eval_loss}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        final, old = os.path.join(root, BEST), None
        if os.path.exists(final):
            old = os.path.join(root, f".old-{BEST}-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


class BestKeeper:
    """eval.keep_best in the launcher: after each checkpoint written, root/best is made of it when its step's eval
    loss is lower than the kept one's (the first of equal ones stays). A resumed run starts from the kept best."""

    def __init__(self, root: str, enabled: bool):
        self.root, self.enabled = root, enabled
        self.best = best_eval_loss(root) if enabled else None

    def written(self, step: int, path: str, records: list[dict]) -> str | None:
        """After checkpoint `step` was written at `path`, given the run's metrics records so far (the step's came
        before its checkpoint): root/best's path when the checkpoint became the best, else None."""
        if not self.enabled:
            return None
        loss = next((r.get("eval_loss") for r in reversed(records) if r.get("step") == step), None)
        if not isinstance(loss, (int, float)) or isinstance(loss, bool) or not math.isfinite(loss):
            return None
        if self.best is not None and not loss < self.best:
            return None
        kept = keep_best(self.root, path, float(loss))
        self.best = float(loss)
        return kept


def check_resumable(path: str, cfg: JobConfig, unit_numels: list[int]) -> dict:
    """The checkpoint's meta, after checking it fits this job; a ConfigError naming `resume` otherwise."""
    meta = read_meta(path)
    if list(meta.get("unit_numels", [])) != list(unit_numels):
        old = (meta.get("config") or {}).get("model", "another model")
        raise ConfigError([{"loc": "resume", "msg": f"{path} was written for another model shape ({old!r}, "
                                                   f"{sum(meta.get('unit_numels', []))} parameters; this job's "
                                                   f"model has {sum(unit_numels)}): use a new output_dir or "
                                                   f"set resume to false"}])
    if int(meta["step"]) > cfg.steps:
        raise ConfigError([{"loc": "resume", "msg": f"{path} is at step {meta['step']}, past this job's steps "
                                                   f"({cfg.steps}): raise steps or use a new output_dir"}])
    return meta


def load(path: str, cfg: JobConfig, state) -> tuple[int, dict | None]:
    """Fill the host state from a checkpoint; returns (step, data position)."""
    import torch

    meta = check_resumable(path, cfg, state.layout.unit_numels)
    for kind in KINDS:
        _read_array(_array_path(path, kind), getattr(state, kind), _delivery_copy(state) if kind == "master" else None)
    torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    return int(meta["step"]), meta.get("data_state")


def changed_settings(meta: dict, cfg: JobConfig) -> list[str]:
    """Config keys that differ from the checkpoint's run (a resume with them is no longer the same run)."""
    ignore = {"resume", "output_dir", "export", "checkpoint", "cpu_threads", "policy", "host_ram_gib", "gpu_memory_gib",
              "eval.path", "eval.interval", "eval.max_batches", "eval.keep_best"}  # eval.holdout moves the rows
    old, new = dict(meta.get("config") or {}), cfg.to_dict()
    old.setdefault("eval", {"holdout": 0.0})  # written before the eval section existed

    def walk(a: dict, b: dict, prefix: str) -> list[str]:
        out = []
        for k in sorted(set(a) | set(b)):
            if prefix + k in ignore:
                continue
            va, vb = a.get(k), b.get(k)
            if isinstance(va, dict) and isinstance(vb, dict):
                out += walk(va, vb, f"{prefix}{k}.")
            elif va != vb:
                out.append(f"{prefix}{k}")
        return out

    return walk(old, new, "")


# ---------------------------------------------------------------------------------------- init_from
def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def init_from_problem(path: str, output_dir: str, unit_numels: list[int] | None = None) -> str | None:
    """Why `path` cannot start a run writing to output_dir (unit_numels: the job's model), or None when it can."""
    if not os.path.exists(path):
        return (f"checkpoint directory {path} does not exist; give a complete checkpoint directory (an earlier "
                f"run's output_dir/checkpoints/{PREFIX}NNNNNNNN)")
    if not os.path.isdir(path):
        return f"{path} is a file; give the checkpoint directory ({PREFIX}NNNNNNNN) that holds master.f32"
    if _inside(path, output_dir) or _inside(output_dir, path):
        return (f"{path} lies inside this job's output_dir {output_dir} (or holds it), whose checkpoints a fresh "
                "run removes and writes: copy the checkpoint elsewhere, or give the job another output_dir")
    if not is_complete(path):
        return (f"{path} is not a complete checkpoint: its meta.json is missing or unreadable, or an array is "
                "shorter than meta.json announces (a write cut short); give a complete one")
    if unit_numels is not None:
        meta = read_meta(path)
        theirs = [int(n) for n in meta["unit_numels"]]
        if theirs != [int(n) for n in unit_numels]:
            old = (meta.get("config") or {}).get("model", "another model")
            return (f"{path} was written for another model shape ({old!r}: {sum(theirs)} parameters in "
                    f"{len(theirs)} units; this job's model has {sum(unit_numels)} in {len(unit_numels)}): "
                    "init_from needs a checkpoint of the same model")
    return None


def check_init_from(path: str, output_dir: str, unit_numels: list[int]) -> dict:
    """The checkpoint's meta after checking it can start this job; a ConfigError naming init_from.checkpoint."""
    problem = init_from_problem(path, output_dir, unit_numels)
    if problem:
        raise ConfigError([{"loc": "init_from.checkpoint", "msg": problem}])
    return read_meta(path)


def load_weights(path: str, state, zero_moments: bool = True) -> int:
    """Fill a host state's master weights from a checkpoint's master.f32 (opened read-only); the AdamW moments
    are zeroed and the bf16 delivery copy is made from the master. Returns the checkpoint's step.

    zero_moments=False leaves the moments as they are: for a state just created (HostState.fresh), whose moments
    read as zeros already, writing zeros would only touch 8 B/param."""
    meta = read_meta(path)
    _read_array(_array_path(path, "master"), state.master, _delivery_copy(state))
    if zero_moments:
        state.exp_avg.zero_()
        state.exp_avg_sq.zero_()
    return int(meta["step"])
