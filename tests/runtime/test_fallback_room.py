"""Nothing finished is lost with checkpoint.interval 0 either: the room for the last step's checkpoint is taken
when training starts, so a disk that fills up during training still takes it when the export fails.

Each run trains in a process of its own whose output folder is a small tmpfs mounted in a private user and mount
namespace (`unshare -Urm`, no root needed): the disk really is full, ENOSPC comes from the kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3

RUN = textwrap.dedent(
    """
    import errno, json, os, sys
    import slidedp
    from slidedp.config import ConfigError
    from slidedp.launch import ExportFailed
    from slidedp.persist import checkpoint as ckpt

    data, out, fill = sys.argv[1], sys.argv[2], sys.argv[3] == "fill"
    steps = int(sys.argv[4])

    def fill_disk(record):
        # Something else takes every free byte of the disk while the last step runs.
        if fill and record["step"] == steps:
            fd = os.open(os.path.join(out, "filler"), os.O_WRONLY | os.O_CREAT)
            for size in (1 << 16, 4096, 1):
                while True:
                    try:
                        os.write(fd, b"x" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        break
            os.close(fd)

    cfg = {"model": "tiny-qwen3", "data": {"path": data, "format": "tokens"}, "seq_len": 32,
           "micro_batch_size": 2, "steps": steps, "ranks": 1, "precision": "fp32", "output_dir": out,
           "checkpoint": {"interval": 0, "keep": 2}, "cpu_threads": 1, "report_to": []}
    result = {"free_at_end": None}
    try:
        slidedp.train(cfg, on_step=fill_disk)
        result["outcome"] = "completed"
    except ExportFailed as exc:
        result.update(outcome="export_failed", message=str(exc), checkpoint=exc.checkpoint,
                      complete=bool(exc.checkpoint) and ckpt.is_complete(exc.checkpoint),
                      step=ckpt.read_meta(exc.checkpoint)["step"] if exc.checkpoint else None)
    except ConfigError as exc:
        result.update(outcome="refused", errors=exc.errors)
    result["left"] = sorted(os.listdir(out)) if os.path.isdir(out) else []
    print("RESULT " + json.dumps(result), flush=True)
    """
)


def _userns_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                          capture_output=True, timeout=10)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not _userns_tmpfs(), reason="this kernel does not let a user mount a tmpfs")


def _train_on_tmpfs(tmp_path: Path, size: str, fill: bool) -> dict:
    from tests.runtime.exactness import make_token_data

    data = make_token_data(str(tmp_path / "data.jsonl"), rows=12, seq_len=32, seed=3)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    script = tmp_path / "run.py"
    script.write_text(RUN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "runtime"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    shell = (f"mount -t tmpfs -o size={size} tmpfs '{disk}' && exec '{sys.executable}' '{script}' "
             f"'{data}' '{out}' {'fill' if fill else 'keep'} {STEPS}")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", shell], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the run printed no result (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_a_disk_filled_during_training_still_keeps_the_last_step(tmp_path):
    result = _train_on_tmpfs(tmp_path, "64m", fill=True)
    assert result["outcome"] == "export_failed", result
    last = result["checkpoint"]
    assert last is not None and last.endswith(f"/checkpoints/step-{STEPS:08d}"), result
    assert result["complete"] and result["step"] == STEPS
    msg = result["message"]
    assert f"all {STEPS} steps trained, but the export failed" in msg and "only 0.0 MiB is free" in msg, msg
    assert "it is lost" not in msg and f"slidedp export --checkpoint {last}" in msg, msg
    assert "set checkpoint.interval to 0" not in msg, msg
    assert ".slidedp-reserve" not in result["left"], result["left"]


def test_a_disk_without_room_for_the_last_checkpoint_is_refused_before_training(tmp_path):
    result = _train_on_tmpfs(tmp_path, "1m", fill=False)
    assert result["outcome"] == "refused", result
    (error,) = result["errors"]
    assert error["loc"] == "output_dir"
    assert "checkpoint.interval is 0" in error["msg"] and "GiB is free" in error["msg"], error
    assert "set checkpoint.interval to 0" not in error["msg"], error
    assert "metrics.jsonl" not in result["left"] and ".slidedp-reserve" not in result["left"], result["left"]
