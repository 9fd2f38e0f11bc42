"""One live process per job folder: a lock the kernel releases when its holder dies.

An attempt of a job writes its folder (checkpoints, metrics.jsonl, final/) from the job process. A worker killed
with SIGKILL leaves that process running: it notices, stops at its next step boundary and saves, which can take
a step's time or more. Were a new attempt to start meanwhile in the same folder, two processes would write one
run's checkpoints (the old one's save landing after the new one resumed). So the job process holds an exclusive
flock on `.slidedp-job.lock` in the folder for its whole life, and nothing writes the folder before it has it.

flock, not fcntl's record locks: a record lock belongs to a process and is dropped when that process closes any
descriptor of the file (a library opening the lock file by accident, or the probe below run from the holder
itself); a flock belongs to the open file description, so only the holder's own descriptor, or its death,
releases it. The descriptor is close-on-exec: the rank processes (fresh interpreters) do not inherit it, and
they write nothing in the folder (the job process writes every checkpoint), so they can neither break the lock
nor need it.

The file holds "PID HOST BOOT_ID" of the holder, which leads its process group (the job process and its ranks):
a new attempt that finds the lock held waits a bounded time for the old attempt to stop, then kills that group
when it is on this machine, and refuses to start otherwise.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Optional

LOCK_NAME = ".slidedp-job.lock"
POLL_S = 0.2
KILL_WAIT_S = 10.0  # after SIGKILL the kernel closes the holder's files within milliseconds; this is slack


class FolderBusy(Exception):
    """Another live process holds the job folder; the message says which and what to do."""


def lock_path(folder: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(folder), LOCK_NAME)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return "-"


def identity() -> str:
    """What the holder writes in the lock file: enough to tell whether its pid means a process on this machine."""
    return f"{os.getpid()} {socket.gethostname()} {_boot_id()}"


class FolderLock:
    """The exclusive lock of one job folder, held by this process until release() or its death."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.path = lock_path(folder)
        self.fd: Optional[int] = None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; False when another open file description holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise
            # A holder removes the file before it lets go (release()): a lock on a file no longer at the path
            # guards nothing, so take the one the path names now.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (identity() + "\n").encode(), 0)
        self.fd = fd
        return True

    def release(self) -> None:
        """Remove the file and let go (removed first, while held: see try_acquire)."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def holder(folder: str | os.PathLike[str]) -> Optional[str]:
    """"PID HOST BOOT_ID" of the live process holding the folder's lock ("?" when it wrote nothing yet), or None
    when no process holds it. Creates nothing: a folder without the file is not held."""
    try:
        fd = os.open(lock_path(folder), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no such file (or folder), or unreadable here: nothing this process can see holds it
    try:
        try:
            # A shared lock is refused only while an exclusive one is held; it is dropped at once below.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            return os.pread(fd, 256, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held(folder: Optional[str]) -> bool:
    return bool(folder) and holder(folder) is not None


def local_group(found: Optional[str]) -> Optional[int]:
    """The process group a holder leads when it is a process of this machine (same host name and boot), else None:
    a pid written on another host, or before a reboot, names some other process here."""
    parts = (found or "").split()
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    pid, host, boot = int(parts[0]), parts[1], parts[2]
    if host != socket.gethostname() or boot != _boot_id() or pid == os.getpid():
        return None
    try:
        return pid if os.getpgid(pid) == pid else None
    except ProcessLookupError:
        return None


def _wait(lock: FolderLock, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if lock.try_acquire():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def take(
    folder: str | os.PathLike[str], wait_s: float, log: Callable[[str], None] = lambda _: None
) -> FolderLock:
    """The folder's lock for this process. Held by another: wait up to wait_s for it to end, then kill its
    process group when it is on this machine; FolderBusy when the lock still cannot be had."""
    lock = FolderLock(folder)
    if _wait(lock, min(1.0, wait_s)):  # a probe (holder()) holds it for microseconds: not worth a log line
        return lock
    found = holder(folder)
    who = _describe(found)
    log(f"{os.fspath(folder)} is in use by {who}: an earlier attempt of this job still running; waiting up to "
        f"{wait_s:g} s for it to stop")
    if _wait(lock, wait_s):
        log(f"{os.fspath(folder)} is free: starting")
        return lock
    found = holder(folder) or found
    group = local_group(found)
    if group is not None:
        log(f"{_describe(found)} did not stop within {wait_s:g} s: killing its process group")
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if _wait(lock, KILL_WAIT_S):
            return lock
    raise FolderBusy(
        f"{os.fspath(folder)} is in use by {_describe(found)} (its lock {LOCK_NAME} is held), which did not "
        f"stop within {wait_s:g} s and cannot be ended from here; nothing was written: end that process (or "
        "wait for it), then start the job again"
    )


def _describe(found: Optional[str]) -> str:
    parts = (found or "").split()
    if len(parts) >= 2 and parts[0].isdigit():
        return f"process {parts[0]} on {parts[1]}"
    return "another process"
