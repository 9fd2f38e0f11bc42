"""Real parts for the fault and guard tests, next to backend_support's: the API as its own process (so it can be
killed and started again on the same port), a worker in a private mount namespace (so a test can give it a tiny
filesystem without root), the shared-memory segments of a run, and a Prometheus scrape."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import httpx
from backend_support import ROOT, WorkerProcess, free_port, wait_for


class ApiProcess:
    """`uvicorn slidedp_web.main:app` as a process configured by the settings' environment, as docker compose runs
    it; kill() and start() again keep the port."""

    def __init__(self, settings, logfile: Path, extra_env: Optional[dict] = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **settings.env(), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        self.logfile = logfile
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> ApiProcess:
        argv = [sys.executable, "-m", "uvicorn", "slidedp_web.main:app", "--host", "127.0.0.1"]
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                argv + ["--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(ROOT),
            )

        def up() -> bool:
            assert self.proc.poll() is None, f"the API exited:\n{self.log()[-3000:]}"
            try:
                return httpx.get(self.url + "/api/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "the API process to answer")
        return self

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(30)

    def __enter__(self) -> ApiProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill(signal.SIGTERM)


def userns_mounts_work() -> bool:
    """Whether this kernel lets an unprivileged process mount a tmpfs in its own user and mount namespace."""
    try:
        done = subprocess.run(
            ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class NamespacedWorker(WorkerProcess):
    """A worker that sees small tmpfs filesystems mounted over the given folders ({folder: size such as '4m'}),
    in a mount namespace of its own: its job processes see them too, nothing outside does."""

    def __init__(self, settings, logfile: Path, mounts: dict[Path, str], **kwargs):
        super().__init__(settings, logfile, **kwargs)
        self.mounts = mounts

    def start(self) -> NamespacedWorker:
        script = "".join(
            f"mount -t tmpfs -o size={size} tmpfs '{path}' && " for path, size in self.mounts.items()
        )
        script += f"exec '{sys.executable}' -c 'import sys; from slidedp_web.worker import main; sys.exit(main([]))'"
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "-Urm", "sh", "-c", script],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(ROOT),
            )
        wait_for(lambda: "ready." in self.log() or self.proc.poll() is not None, 60, "the worker to be ready")
        assert self.proc.poll() is None, f"worker exited:\n{self.log()[-3000:]}"
        return self


def segments(shm_dir: Path) -> list[str]:
    """The runtime's shared-memory files in a folder (slidedp.step.host_state: slidedp-<pid>-<hex>.*)."""
    return (
        sorted(p.name for p in shm_dir.iterdir() if p.name.startswith("slidedp-")) if shm_dir.is_dir() else []
    )


def job_pid(worker: WorkerProcess, job_id: int, attempt: int = 1) -> int:
    found = wait_for(
        lambda: re.search(rf"job {job_id} attempt {attempt}: job process (\d+)", worker.log()),
        30,
        f"the pid of job {job_id} in the worker log",
    )
    return int(found.group(1))


def group_members(pgid: int) -> dict[int, bytes]:
    """The live processes of a process group and their command lines. A zombie is left out: it is dead
    already, only not yet reaped by its new parent (init, once the job process that started it is gone)."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited while the table was read
        # the command name may hold spaces and parentheses: the fields after the last ')' are fixed
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members[int(entry.name)] = cmdline
    return members


def rank_pids(pgid: int) -> list[int]:
    return [pid for pid, cmdline in group_members(pgid).items() if b"slidedp.step.rank" in cmdline]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics parsed: {(name, ((label, value), ...)): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def stream_events(client: httpx.Client, url: str, headers: Optional[dict] = None, timeout: float = 120):
    """Events of an SSE stream as {"id", "event", "data"}, yielded as they arrive (the caller may break off, or
    see the connection fail when the server dies)."""
    import json

    current: dict = {}
    with client.stream("GET", url, headers=headers or {}, timeout=httpx.Timeout(timeout, read=30)) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line == "":
                if "data" in current:
                    yield {
                        "id": int(current["id"]) if "id" in current else None,
                        "event": current.get("event", "message"),
                        "data": json.loads(current["data"]),
                    }
                current = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(":")
                current[key] = value[1:] if value.startswith(" ") else value


def metric_steps(events: list[dict]) -> list[int]:
    return [e["data"]["step"] for e in events if e["event"] == "metrics"]


def statuses(events: list[dict]) -> list[str]:
    return [e["data"]["status"] for e in events if e["event"] == "status"]
