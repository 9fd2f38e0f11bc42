"""A job never runs twice: its folder is held by one live process at a time (slidedp_web/folder_lock.py).

The worker is SIGKILLed mid-job while its job process is inside a long step (a rank stopped with SIGSTOP stands
for one). The job process outlives it: the next worker on the host must not mark the job interrupted while that
process still holds the folder, so no resume can start a second attempt beside it; the orphan stops at its step
boundary, saves, and records its own end; the resume then continues from the orphan's checkpoint.

The lock itself: a second process is refused while the first lives and gets the folder once the first is
SIGKILLed; a new attempt waits for a holder, kills the group of one that does not stop, and refuses one it cannot
end (a process on another machine).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backend_support import WorkerProcess, read_sse, tiny_job, wait_for, wait_status
from fault_support import group_alive, job_pid, metric_steps, rank_pids, statuses
from slidedp_web import folder_lock

HOLDER = """
import os, sys, time
from slidedp_web.folder_lock import FolderLock
lock = FolderLock(sys.argv[1])
assert lock.try_acquire()
if len(sys.argv) > 2:  # pose as a process of another machine
    os.pwrite(lock.fd, (sys.argv[2] + "\\n").encode(), 0)
print("held", flush=True)
time.sleep(float(os.environ.get("HOLD_S", "600")))
lock.release()
"""


def _holder(folder: Path, *identity: str, hold_s: float = 600) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), *identity],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # leads its group, as a job process does
        env={**os.environ, "HOLD_S": str(hold_s)},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_second_process_is_refused_the_folder_until_the_first_is_killed(tmp_path):
    first = _holder(tmp_path)
    try:
        second = folder_lock.FolderLock(tmp_path)
        assert second.try_acquire() is False
        assert second.fd is None
        found = folder_lock.holder(tmp_path)
        assert found is not None and found.split()[0] == str(first.pid)
        assert folder_lock.held(str(tmp_path))
        # probing does not take the folder from its holder
        assert second.try_acquire() is False
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    assert folder_lock.holder(tmp_path) is None  # the kernel let go when the holder died
    assert second.try_acquire() is True
    assert (tmp_path / folder_lock.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    assert folder_lock.held(str(tmp_path))  # held by this process: another open of the file is refused too
    second.release()
    assert not (tmp_path / folder_lock.LOCK_NAME).exists()
    assert folder_lock.holder(tmp_path) is None


def test_a_new_attempt_waits_for_a_holder_that_ends(tmp_path):
    first = _holder(tmp_path, hold_s=1.5)
    lines: list[str] = []
    try:
        lock = folder_lock.take(tmp_path, wait_s=60, log=lines.append)
        assert first.wait(10) == 0  # it ended on its own: nothing was killed
    finally:
        _end(first)
    assert lock.fd is not None
    assert any("waiting up to 60 s" in line for line in lines), lines
    assert not any("killing" in line for line in lines), lines
    lock.release()


def test_a_new_attempt_kills_the_group_of_a_holder_that_does_not_stop(tmp_path):
    first = _holder(tmp_path)
    lines: list[str] = []
    try:
        lock = folder_lock.take(tmp_path, wait_s=1.5, log=lines.append)
        first.wait(10)
    finally:
        _end(first)
    assert first.returncode == -signal.SIGKILL
    assert f"process {first.pid} on" in lines[0] and "waiting up to 1.5 s" in lines[0], lines
    assert any("did not stop within 1.5 s: killing its process group" in line for line in lines), lines
    assert (tmp_path / folder_lock.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    lock.release()


def test_a_new_attempt_refuses_a_holder_it_cannot_end(tmp_path):
    first = _holder(tmp_path, f"{os.getpid() + 100000} elsewhere some-boot")
    try:
        with pytest.raises(folder_lock.FolderBusy) as busy:
            folder_lock.take(tmp_path, wait_s=1.0)
        assert first.poll() is None, "a process of another machine is never signalled"
    finally:
        _end(first)
    msg = str(busy.value)
    assert f"in use by process {os.getpid() + 100000} on elsewhere" in msg
    assert "did not stop within 1 s" in msg and "nothing was written" in msg


# ------------------------------------------------------------------------------- a real worker, kill -9
STEPS = 60
CHECKPOINT_LINE = re.compile(r"checkpoint (of step \d+ )?written to .*/checkpoints/step-\d+$")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_workers_job_is_not_run_twice(client, settings, module_dir, dataset):
    config = tiny_job(dataset, steps=STEPS, checkpoint={"interval": 2})
    worker = WorkerProcess(settings, module_dir / "once-1.log").start()
    again = None
    pid = None
    try:
        job = client.post("/api/jobs", json=config).json()
        seen = read_sse(
            client, f"/api/jobs/{job['id']}/events", stop=lambda ev: len(metric_steps(ev)) >= 3, timeout=150
        )
        pid = job_pid(worker, job["id"])
        ranks = rank_pids(pid)
        assert len(ranks) == 1, ranks
        os.killpg(worker.proc.pid, signal.SIGKILL)  # the worker only: the job leads a group of its own
        worker.proc.wait(10)
        # The job process is now inside a step that does not end, and cannot reach the boundary where it stops.
        # Stopped only now, the rank is spared the SIGHUP the kernel sends a group with a stopped member when
        # the group is orphaned (its parent, the worker, died); the job process notices its worker's death
        # within a second, long after this.
        os.kill(ranks[0], signal.SIGSTOP)
        assert group_alive(pid)
        folder = client.get(f"/api/jobs/{job['id']}").json()["output_dir"]

        # The next worker on this host starts while the old job process lives: the job stays running, past the
        # heartbeat timeout too (the orphan writes its heartbeat), and cannot be resumed beside it.
        again = WorkerProcess(settings, module_dir / "once-2.log").start()
        until = time.monotonic() + settings.heartbeat_timeout_s + 2
        while time.monotonic() < until:
            current = client.get(f"/api/jobs/{job['id']}").json()
            assert current["status"] == "running", current
            time.sleep(0.5)
        assert (folder_lock.holder(folder) or "").split()[:1] == [str(pid)]
        refused = client.post(f"/api/jobs/{job['id']}/resume")
        assert refused.status_code == 409 and "running" in refused.json()["detail"]
        assert group_alive(pid)

        # The step ends: the orphan stops there, saves that step and records the job interrupted itself.
        os.kill(ranks[0], signal.SIGCONT)
        stopped = wait_status(client, job["id"], ("interrupted", "failed", "completed"), timeout=60)
        assert stopped["status"] == "interrupted", stopped
        assert "died during the job, which stopped on its own" in stopped["error"]["message"]
        wait_for(lambda: not group_alive(pid), 30, "the orphaned job process to exit")
        assert folder_lock.holder(folder) is None
        saved = stopped["step"]
        assert 3 <= saved < STEPS
        assert stopped["checkpoints"][-1] == f"step-{saved:08d}", stopped["checkpoints"]

        assert client.post(f"/api/jobs/{job['id']}/resume").json()["status"] == "queued"
        done = wait_status(client, job["id"], ("completed", "failed"), timeout=150)
        assert (done["status"], done["step"]) == ("completed", STEPS), done
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        worker.stop()
        if again is not None:
            again.stop()

    events = read_sse(client, f"/api/jobs/{job['id']}/events")
    assert events[: len(seen)] == seen
    assert statuses(events) == ["queued", "running", "interrupted", "queued", "running", "completed"]
    cut = next(
        i for i, e in enumerate(events) if e["event"] == "status" and e["data"]["status"] == "interrupted"
    )
    assert metric_steps(events[:cut]) == list(range(1, saved + 1))
    assert metric_steps(events[cut:]) == list(range(saved + 1, STEPS + 1))
    lines = [e["line"] for e in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
    # Every checkpoint of the first attempt is written before the second starts, which resumes from the newest;
    # the second writes only the steps after it, in order.
    started = next(i for i, line in enumerate(lines) if line.startswith("attempt 2 on"))
    written = [int(re.search(r"step-(\d+)", line).group(1)) for line in lines if CHECKPOINT_LINE.search(line)]
    first = [int(re.search(r"step-(\d+)", line).group(1)) for line in lines[:started] if CHECKPOINT_LINE.search(line)]
    assert first and first[-1] == saved, first
    assert written[len(first) :] == list(range(saved + 2 - saved % 2, STEPS + 1, 2)), written
    assert any(line.startswith(f"resumed from step {saved} ") for line in lines[started:]), lines[started:]
