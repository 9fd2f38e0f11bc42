"""Rank processes: the one way training, the peer baselines and calibration start theirs.

A `Launch` starts `world` fresh interpreters, `python -m slidedp.ranks TARGET SPEC RANK WORLD`, where TARGET is
"module:function". Each rank imports TARGET and calls `function(args, rank_link)`; whatever the function sends
with `rank_link.send(kind, payload)` reaches the launcher as (kind, rank, payload) through a unix socket in the
launch's private directory (0700, with an auth key); a function that returns a value sends it as "result", and a
function that raises sends "error" with the traceback (and whether it ran out of memory). The process group's
rendezvous is a file in the same directory (`rank_link.init_file`): no port is opened.

`spawn()` starts the ranks before their args exist: each connects, imports TARGET's module (and calls its
`prepare()`, where the module has one: work to start while it waits, returning at once) and waits for the args that
`start(args)` then sends over its connection. train() spawns its ranks this way, so that they start while it
makes the plan the args carry; a launcher that ends without sending them ends the ranks waiting (they exit quietly).

Why fresh interpreters: CUDA does not survive fork, `multiprocessing`'s spawn re-imports the caller's main module
(a script without a main guard runs twice), and a fresh process is measured as a user would run it. The launcher
imports no torch: a web worker's job process or a bench command stays free of CUDA, and the host memory the ranks
need is not held by their parent.
"""

from __future__ import annotations

import importlib
import os
import pickle
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slidedp import bytecode

# Set in every rank unless the caller already chose: NVLink multicast (NVLS) stays off.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LOG_TAIL_CHARS = 3000


class RankFailed(RuntimeError):
    """A rank ended without answering, answered with an error, or did not answer in time."""

    def __init__(self, message: str, rank: int | None = None, oom: bool = False):
        super().__init__(message)
        self.rank = rank
        self.oom = oom


def rank_env(rank: int, world: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A rank's environment: this process's, with this very slidedp importable (installed or not), gloo on the
    loopback, NVLS off, the identity a launcher such as torchrun gives (no MASTER_ADDR: the rendezvous is a
    file), and a bytecode cache of its own where the installed packages have no bytecode (slidedp.bytecode)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for key, value in GPU_ENV.items():
        env.setdefault(key, value)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    for key, value in bytecode.rank_env_changes(env).items():  # packages without bytecode: a cache of the ranks'
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.update(extra or {})
    return env


class Launch:
    """`world` rank processes running `target` (a "module:function" name) on the args given to `start`.

    Use as a context manager: leaving it kills the ranks still running and removes the private directory.
    `log=True` sends each rank's stdout and stderr to a file there (`log_tail(rank)` reads its end); otherwise
    they go where this process's go.
    """

    def __init__(self, target: str, world: int, *, prefix: str = "slidedp-ranks-",
                 env: dict[str, str] | None = None, log: bool = False):
        if ":" not in target:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        if world < 1:
            raise ValueError(f"world must be at least 1, got {world}")
        from multiprocessing.connection import Listener

        self.target, self.world = target, world
        self.env, self.log = dict(env or {}), log
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.init_file = os.path.join(self.dir, "rendezvous")
        self.procs: list[subprocess.Popen] = []
        self._authkey = secrets.token_bytes(16)
        self._address = os.path.join(self.dir, "ranks.sock")
        self._listener = Listener(self._address, family="AF_UNIX", authkey=self._authkey)
        self._conns: list = []
        self._spawned = False
        self.args_sent = False  # start() has given the ranks their args
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def spawn(self) -> None:
        """Start the ranks now, without their args: each imports its target's module and waits for `start`."""
        if self.procs:
            raise RuntimeError("the ranks of this launch are started already")
        self._popen(self._write_spec(None))
        self._spawned = True

    def start(self, args: Any, connect_timeout_s: float = 300.0) -> None:
        """Start the ranks; each calls the target with `args` (anything picklable). Ranks started by `spawn` get
        `args` over their connection, once every one has connected (RankFailed when one exits first, or when
        they have not all connected within connect_timeout_s)."""
        if self.args_sent:
            raise RuntimeError("the ranks of this launch have their args already")
        if self._spawned:
            conns = self._connected(connect_timeout_s)
            try:
                self._raise_if_ended()  # connected, then gone: its socket may still take the send
                for conn in conns:
                    conn.send(args)
            except OSError:  # a rank that ended while the args went out (a broken pipe, a reset connection)
                time.sleep(0.1)  # its exit is reaped, for the error to name it
                self._raise_if_ended()
                raise
        else:
            self._popen(self._write_spec(args))
        self.args_sent = True

    def _write_spec(self, args: Any) -> str:
        spec = os.path.join(self.dir, "spec.pkl")
        with open(spec, "wb") as fh:
            pickle.dump({"args": args, "later": args is None, "address": self._address,
                         "authkey": self._authkey, "init_file": self.init_file, "dir": self.dir}, fh)
        return spec

    def _popen(self, spec: str) -> None:
        for r in range(self.world):
            out = open(os.path.join(self.dir, f"rank{r}.log"), "wb") if self.log else None  # noqa: SIM115
            try:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "slidedp.ranks", self.target, spec, str(r), str(self.world)],
                    env=rank_env(r, self.world, self.env), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT if out else None))
            finally:
                if out is not None:
                    out.close()

    def _raise_if_ended(self) -> None:
        """RankFailed for the first rank that has exited (spawned ranks end only after their args)."""
        ended = [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None]
        if ended:
            r, code = ended[0]
            raise RankFailed(f"rank {r} exited with code {code} before it was given its work" + self._tail_note(r),
                             rank=r)

    def _connected(self, timeout_s: float) -> list:
        """Every rank's connection, once all `world` have connected."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                conns = list(self._conns)
            if len(conns) >= self.world:
                return conns
            self._raise_if_ended()
            if time.monotonic() > deadline:
                raise RankFailed(f"{self.world - len(conns)} of {self.world} ranks did not connect in "
                                 f"{timeout_s:.0f} s" + self._tail_note(0))
            time.sleep(0.01)

    def get(self, timeout: float) -> tuple[str, int, Any]:
        """The next message from any rank; queue.Empty when none came within `timeout` seconds."""
        from multiprocessing.connection import wait

        deadline = time.monotonic() + timeout
        while True:
            with self._lock:  # ranks connect while this waits: look again every 50 ms
                conns = list(self._conns)
            slot = min(0.05, max(0.0, deadline - time.monotonic()))
            if conns:
                for conn in wait(conns, timeout=slot):
                    try:
                        return conn.recv()
                    except (EOFError, OSError):
                        with self._lock:
                            self._conns.remove(conn)
            else:
                time.sleep(slot)
            if time.monotonic() >= deadline:
                raise queue.Empty

    def drain(self, timeout: float) -> list[tuple[str, int, Any]]:
        """The messages still to be read (a rank's last words before it exited), waiting `timeout` for each."""
        out = []
        while True:
            try:
                out.append(self.get(timeout))
            except queue.Empty:
                return out

    def failed(self) -> list[tuple[int, int]]:
        """(rank, exit code) of the ranks that have exited with an error."""
        return [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() not in (None, 0)]

    def results(self, timeout_s: float, grace_s: float = 10.0) -> list[Any]:
        """Every rank's "result", in rank order. Raises RankFailed when a rank sends "error", exits without a
        result (the others get `grace_s` to answer first: they may be blocked in a collective), or when
        `timeout_s` passes."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        while len(got) < self.world:
            try:
                kind, rank, payload = self.get(timeout=0.1)
            except queue.Empty:
                now = time.monotonic()
                dead = [(r, c) for r, c in self.failed() if r not in got]
                exited = [r for r, p in enumerate(self.procs) if p.poll() == 0 and r not in got]
                if (dead or exited) and failed_at is None:
                    failed_at = now
                if failed_at is not None and now - failed_at > grace_s:
                    r, code = (dead or [(exited[0], 0)])[0]
                    raise RankFailed(f"rank {r} exited with code {code} without a result"
                                     + self._tail_note(r), rank=r) from None
                if now > deadline:
                    raise RankFailed(f"no result from rank(s) {sorted(set(range(self.world)) - set(got))} in "
                                     f"{timeout_s:.0f} s" + self._tail_note(0)) from None
                continue
            if kind == "error":
                raise RankFailed(f"rank {rank} failed:\n{payload['traceback']}", rank=rank, oom=payload["oom"])
            if kind == "result":
                got[rank] = payload
        return [got[r] for r in range(self.world)]

    def wait(self, timeout: float) -> None:
        for p in self.procs:
            p.wait(timeout=timeout)

    def log_tail(self, rank: int) -> str:
        try:
            with open(os.path.join(self.dir, f"rank{rank}.log"), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL_CHARS))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _tail_note(self, rank: int) -> str:
        tail = self.log_tail(rank) if self.log else ""
        return f"; rank {rank} log tail:\n{tail}" if tail else ""

    def close(self) -> None:
        """Terminate the ranks still running (killed after 10 s), close the socket, remove the directory."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._listener.close()
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)


# ---------------------------------------------------------------------------------------------- rank side
@dataclass
class RankLink:
    """What a rank function is given besides its args: who it is, where the rendezvous is, and how to answer."""

    rank: int
    world: int
    init_file: str
    dir: str
    conn: Any
    waited_s: float | None = None  # spawned before its args: seconds from its target's import to their arrival

    def send(self, kind: str, payload: Any = None) -> None:
        self.conn.send((kind, self.rank, payload))

    def join(self, cuda: bool, gpu_memory_gib: float | None = None,
             on_device: Callable[[], None] | None = None) -> Joined:
        """The one way a rank starts: its device (CUDA device `rank`, made current, its allocator capped at
        gpu_memory_gib with slidedp.step.devices.apply_memory_cap; or the CPU), then the process group joined
        through this launch's file:// rendezvous (NCCL bound to the device, or gloo). on_device is called between
        the two (the training rank times them apart)."""
        import torch
        import torch.distributed as dist

        memory_cap = None
        if cuda:
            from slidedp.step.devices import apply_memory_cap

            device = torch.device("cuda", self.rank)
            torch.cuda.set_device(device)
            memory_cap = apply_memory_cap(device, cap_bytes(gpu_memory_gib))
        else:
            device = torch.device("cpu")
        if on_device is not None:
            on_device()
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{self.init_file}", rank=self.rank,
                                world_size=self.world, **({"device_id": device} if cuda else {}))
        return Joined(device, memory_cap)


@dataclass
class Joined:
    """A rank that has joined its group: its device, and what the memory cap set (None: no cap)."""

    device: Any  # torch.device
    memory_cap: dict | None


def cap_bytes(gpu_memory_gib: float | None) -> int | None:
    """A job's gpu_memory_gib in bytes (None, or 0: no cap)."""
    return int(gpu_memory_gib * 2**30) if gpu_memory_gib else None


def is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # a failure before torch was imported is no OOM
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


def _main(argv: list[str]) -> None:
    from multiprocessing.connection import Client

    target, spec_path, rank, world = argv[1], argv[2], int(argv[3]), int(argv[4])
    with open(spec_path, "rb") as fh:
        spec = pickle.load(fh)
    conn = Client(spec["address"], family="AF_UNIX", authkey=spec["authkey"])
    link = RankLink(rank, world, spec["init_file"], spec["dir"], conn)
    module, function = target.split(":", 1)
    args = spec["args"]
    if spec.get("later"):  # spawned: import (and prepare) while the launcher still makes the args
        args = _wait_for_args(module, link)
    code = 0
    try:
        result = getattr(importlib.import_module(module), function)(args, link)
        if result is not None:
            link.send("result", result)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the rank ends
        traceback.print_exc()
        link.send("error", {"traceback": traceback.format_exc()[-20000:], "oom": is_oom(exc)})
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not a return into interpreter shutdown. After a failure the other ranks may be blocked in a collective, and
    # a clean teardown would wait for them. After success, a group still referenced elsewhere (FSDP2's DeviceMesh
    # stays in torch's DTensor caches) keeps gloo's worker threads alive past destroy_process_group; once
    # finalization has begun CPython ends such a thread with pthread_exit, whose unwind through a noexcept C++
    # destructor calls std::terminate. What the rank leaves behind is sent or on disk; the OS ends the rest.
    os._exit(code)


def _wait_for_args(module: str, link: RankLink) -> Any:
    """A spawned rank's wait: its target's module imported, its `prepare()` called (if any), then the args read
    from the launcher. A launcher that closes the connection first (its planning failed, or it
    was stopped) ends this rank quietly."""
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - _main imports it again once the args came, and reports the error then
        mod = None
    prepare = getattr(mod, "prepare", None)
    if prepare is not None:
        prepare()
    t0 = time.perf_counter()
    try:
        args = link.conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    link.waited_s = time.perf_counter() - t0
    return args


if __name__ == "__main__":
    _main(sys.argv)
