"""Host-state checkpoints: everything needed to continue a run bit-exactly.

A checkpoint is a directory `step-NNNNNNNN/` holding the fp32 master weights and both AdamW moments as raw
little-endian float32 files (the layout of the host state: units in order, flat), and meta.json with the step,
the data position, the job config, the unit sizes and the RNG state of the launcher. The schedule is a pure
function of the step and the config, so it needs no state of its own; no random numbers are drawn during
training (no dropout), so the ranks have no RNG state to keep.

Writes are atomic: into a temporary directory, every file fsync-ed, then renamed into place and the parent
directory fsync-ed; the last good checkpoint is never replaced by an interrupted write. Free disk is checked
before anything is written. The last `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import torch

from slidedp.config import ConfigError, JobConfig

PREFIX = "step-"
_KINDS = ("master", "exp_avg", "exp_avg_sq")
_CHUNK = 256 * 2**20  # elements written per call, so no extra copy of a whole array is ever made


def step_of(path: str) -> int:
    return int(os.path.basename(path.rstrip("/"))[len(PREFIX):])


def list_checkpoints(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()
             and os.path.exists(os.path.join(root, n, "meta.json"))]
    return [os.path.join(root, n) for n in sorted(names, key=lambda n: int(n[len(PREFIX):]))]


def latest(root: str) -> str | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def checkpoint_bytes(num_params: int) -> int:
    return 12 * num_params


def _write_array(path: str, flat: torch.Tensor) -> None:
    with open(path, "wb") as fh:
        for a in range(0, flat.numel(), _CHUNK):
            fh.write(flat[a : a + _CHUNK].numpy().tobytes())
        fh.flush()
        os.fsync(fh.fileno())


def _read_array(path: str, flat: torch.Tensor) -> None:
    expected = flat.numel() * 4
    if os.path.getsize(path) != expected:
        raise ConfigError([{"loc": "resume", "msg": f"{path} has {os.path.getsize(path)} bytes, the model needs "
                                                   f"{expected}: the checkpoint belongs to another model"}])
    with open(path, "rb") as fh:
        for a in range(0, flat.numel(), _CHUNK):
            n = min(_CHUNK, flat.numel() - a)
            buf = fh.read(n * 4)
            flat[a : a + n].copy_(torch.frombuffer(bytearray(buf), dtype=torch.float32))


def save(root: str, step: int, cfg: JobConfig, state, data_state: dict, keep: int) -> str:
    os.makedirs(root, exist_ok=True)
    need = checkpoint_bytes(state.layout.total) + (1 << 20)
    free = shutil.disk_usage(root).free
    if free < need:
        raise OSError(f"checkpoint of step {step} needs {need / 2**30:.1f} GiB in {root}, only "
                      f"{free / 2**30:.1f} GiB free: free disk, point output_dir elsewhere, or set "
                      f"checkpoint.interval to 0")
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{PREFIX}{step:08d}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _write_array(os.path.join(tmp, "master.f32"), state.master)
    _write_array(os.path.join(tmp, "exp_avg.f32"), state.exp_avg)
    _write_array(os.path.join(tmp, "exp_avg_sq.f32"), state.exp_avg_sq)
    meta = {"step": step, "data_state": data_state, "config": cfg.to_dict(), "unit_numels":
            state.layout.unit_numels, "rng": torch.get_rng_state().tolist(), "written": time.time()}
    with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as fh:
        json.dump(meta, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    dfd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: str, cfg: JobConfig, state) -> tuple[int, dict | None]:
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    if meta["unit_numels"] != state.layout.unit_numels:
        raise ConfigError([{"loc": "resume", "msg": f"{path} was written for another model shape; start a new "
                                                   f"output_dir or set resume to false"}])
    _read_array(os.path.join(path, "master.f32"), state.master)
    _read_array(os.path.join(path, "exp_avg.f32"), state.exp_avg)
    _read_array(os.path.join(path, "exp_avg_sq.f32"), state.exp_avg_sq)
    if state.delivery is not state.master:
        for a in range(0, state.master.numel(), _CHUNK):
            state.delivery[a : a + _CHUNK].copy_(state.master[a : a + _CHUNK])
    torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    return int(meta["step"]), meta.get("data_state")
