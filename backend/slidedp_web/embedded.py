"""`slidedp serve`: the whole workbench on one machine with nothing to set up.

    slidedp serve [--host 127.0.0.1] [--port 8000] [--insecure] [--allow-any-path] [--api-only]

A data directory (SLIDEDP_DATA_DIR, default ./.slidedp) holds a SQLite file, the job outputs and the logs of
the processes started here: a private redis-server (on a unix socket in the data directory, or a free
loopback port when the socket path is too long), one local worker, and the API with the UI. With REDIS_URL or
DATABASE_URL set, those are used instead. Ctrl-C (or SIGTERM) stops the worker — a running job stops at a step
boundary with a checkpoint and can be resumed next time — then Redis. `--api-only` serves the API and the UI
alone (the compose file's api container, where Redis and the worker are services of their own).

Who may call the API follows the bind (core.config.access_for_bind): on loopback, as before, no token unless
SLIDEDP_API_TOKEN is set. On any other address without SLIDEDP_API_TOKEN a random token is made for this run,
required as `Authorization: Bearer`, and printed once to stderr as a login URL `http://<host>:<port>/#token=…`
(the token in the fragment, which a browser never sends to the server); it is also in <data dir>/api-token (0600)
while the server runs, for the container's health check and for scripts. `--insecure` (SLIDEDP_INSECURE=1) serves
such a bind without a token, with a warning.

What a job may read and write follows the bind too (core.config.roots_for_bind): on a non-loopback address each
of SLIDEDP_MODEL_ROOTS, SLIDEDP_DATA_ROOTS and SLIDEDP_OUTPUT_ROOTS left unset is set to a folder of the data
directory (models/, datasets/, jobs/named/), made and printed at start, for the API and the local worker alike.
`--allow-any-path` (SLIDEDP_ALLOW_ANY_PATH=1) leaves them unset, with a warning: any caller may then train on
any file the server can read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from slidedp_web.core.config import Settings

SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="slidedp serve", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=None, help="address to bind (default SLIDEDP_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default SLIDEDP_PORT or 8000)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="on a non-loopback address, serve without a token (default SLIDEDP_INSECURE): anyone who reaches "
        "the port can run jobs as this user",
    )
    parser.add_argument(
        "--allow-any-path",
        action="store_true",
        default=None,
        help="on a non-loopback address, do not confine jobs to the data folder when SLIDEDP_*_ROOTS are unset "
        "(default SLIDEDP_ALLOW_ANY_PATH): any caller can then train on, and read back, any file this user can read",
    )
    parser.add_argument(
        "--api-only",
        action="store_true",
        help="the API and UI only: no private Redis, no local worker (REDIS_URL and workers are elsewhere)",
    )
    return parser.parse_args(argv)


def _say(text: str) -> None:
    """To the terminal (stderr), not through logging: neither a log file nor a log collector gets it."""
    print(text, file=sys.stderr, flush=True)


def _write_token_file(path: Path, token: str) -> None:
    path.unlink(missing_ok=True)  # a new file, so that the mode below applies
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")


def apply_access(
    settings: Settings, host: str, port: int, insecure: bool, data_dir: Path, stack: contextlib.ExitStack
) -> Settings:
    """Decide who may call the API for this bind, say so at start, and return the settings the API runs with."""
    from slidedp_web.core.config import TOKEN_FILE, access_for_bind, base_url, login_url

    access = access_for_bind(host, settings.api_token, insecure or settings.insecure)
    token_file = data_dir / TOKEN_FILE
    if token_file.is_dir() and not token_file.is_symlink():
        if access.generated:
            raise SystemExit(
                f"slidedp serve: {token_file} is a folder, where the generated API token is written (a job's "
                "output folder from an older version may have been put there); move it out of the data folder "
                "and start again"
            )
    else:
        token_file.unlink(missing_ok=True)  # one left by a run that was killed
    if access.generated:
        _write_token_file(token_file, access.token)
        stack.callback(token_file.unlink, missing_ok=True)
        _say(
            f"\nThe API listens on {host}:{port}, beyond this machine, and SLIDEDP_API_TOKEN is not set: it "
            "requires a token made up for this run.\nOpen the workbench with this URL (the token is in the "
            "fragment and never reaches a server log):\n\n"
            f"    {login_url(base_url(host, port, settings.public_url), access.token)}\n\n"
            f"API clients send 'Authorization: Bearer <token>' (the token is also in {token_file}, readable by "
            "this user only, until the server stops).\n"
        )
    elif access.insecure:
        bar = "!" * 78
        _say(
            f"\n{bar}\nWARNING: --insecure / SLIDEDP_INSECURE: the API on {host}:{port} answers ANYONE who can "
            "reach this port,\nwithout a token. They can submit jobs that read and write files as this user "
            f"(uid {os.getuid()}).\nSet SLIDEDP_API_TOKEN, or drop --insecure to get a generated token.\n{bar}\n"
        )
    return settings.model_copy(update={"api_token": access.token, "insecure": access.insecure})


def confine_for_bind(settings: Settings, host: str, allow_any_path: bool) -> Settings:
    """The roots a job is held to on this bind (core.config.roots_for_bind): the data folder's own folders for
    those left unset on a non-loopback bind, made here, said at start, and put in the environment so that the
    local worker and the job processes hold jobs to the same folders."""
    from slidedp_web.core.config import is_loopback, roots_for_bind

    settings = settings.model_copy(update={"allow_any_path": allow_any_path or settings.allow_any_path})
    defaults = roots_for_bind(settings, host)
    for name, folder in defaults.items():
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[f"SLIDEDP_{name.upper()}"] = str(folder)
    if defaults:
        shown = "".join(f"\n    SLIDEDP_{name.upper()}={folder}" for name, folder in defaults.items())
        _say(
            f"\nThe API listens on {host}, beyond this machine: jobs read and write only in these folders of the "
            f"data folder (set the variables to choose others):{shown}\n"
        )
        settings = settings.model_copy(update={name: str(folder) for name, folder in defaults.items()})
    unset = [f"SLIDEDP_{n.upper()}" for n in ("model_roots", "data_roots", "output_roots") if not getattr(settings, n)]
    if unset and not is_loopback(host):
        bar = "!" * 78
        _say(
            f"\n{bar}\nWARNING: --allow-any-path / SLIDEDP_ALLOW_ANY_PATH: the API on {host} is reachable beyond "
            f"this machine and {', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set.\nWhoever may call "
            "it can train on any file this user can read and read it back through generation, and write wherever "
            "this user can write.\nSet the roots to the folders of models, datasets and outputs, or drop "
            f"--allow-any-path to confine jobs to the data folder.\n{bar}\n"
        )
    return settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when `slidedp serve` dies, even by SIGKILL (Linux prctl), so neither
    Redis nor the worker outlives the command. Children run in their own session, so a terminal's Ctrl-C reaches
    only `slidedp serve`, which stops them in order."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group, wait, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def private_redis(data_dir: Path) -> Iterator[str]:
    """A redis-server only this workbench uses, without persistence: the database is the record, and queued
    jobs are sent again when the API finds an empty Redis."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit(
            "slidedp serve: redis-server is not installed (Debian: apt-get install redis-server; "
            "scripts/setup.sh does it), or set REDIS_URL to a running Redis"
        )
    sock = data_dir / "redis.sock"
    args = [
        binary,
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
        "--daemonize",
        "no",
        "--pidfile",
        str(data_dir / "redis.pid"),
        "--logfile",
        str(data_dir / "redis.log"),
    ]
    if len(str(sock)) <= SOCKET_PATH_MAX:
        sock.unlink(missing_ok=True)
        args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
        url = f"unix://{sock}"
    else:
        port = free_port()
        args += ["--port", str(port), "--bind", "127.0.0.1"]
        url = f"redis://127.0.0.1:{port}/0"
    proc = subprocess.Popen(
        args, start_new_session=True, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent
    )
    try:
        _wait_for_redis(url, proc, data_dir / "redis.log")
        yield url
    finally:
        _stop(proc, 10)
        sock.unlink(missing_ok=True)


def _wait_for_redis(url: str, proc: subprocess.Popen, logfile: Path, timeout: float = 20.0) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            raise SystemExit(f"slidedp serve: redis-server exited with code {proc.returncode}:\n{tail}")
        with contextlib.suppress(redis.RedisError, OSError):
            if redis.Redis.from_url(url, socket_connect_timeout=1).ping():
                return
        time.sleep(0.1)
    raise SystemExit(f"slidedp serve: redis-server did not answer within {timeout:g} s (log: {logfile})")


class LocalWorker:
    """`slidedp worker` as a child process, started again if it dies while the workbench runs."""

    def __init__(self, env: dict[str, str], logfile: Path, stop_timeout: float):
        self.env, self.logfile, self.stop_timeout = env, logfile, stop_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.closing = threading.Event()
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            log = open(self.logfile, "ab")  # noqa: SIM115 - owned by the child for its lifetime
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slidedp_web.worker"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            log.close()

    def watch(self) -> None:
        restarts = 0
        while not self.closing.wait(2.0):
            if self.proc is not None and self.proc.poll() is not None and restarts < 5:
                print(
                    f"slidedp serve: the worker exited with code {self.proc.returncode} (log: {self.logfile}); "
                    "starting it again",
                    file=sys.stderr,
                    flush=True,
                )
                restarts += 1
                self.start()

    def stop(self) -> None:
        self.closing.set()
        with self.lock:
            if self.proc is not None:
                _stop(self.proc, self.stop_timeout)


class _Stop(Exception):
    """SIGINT/SIGTERM: leave the `with` blocks so that the worker and Redis are stopped in order."""


def _install_stop_handlers() -> None:
    # uvicorn restores the handlers it found and re-raises the signal after its own graceful shutdown; these
    # turn that signal into an exception once, so the cleanup below runs, and ignore repeats while it runs.
    def stop(signum: int, _frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, repeat)
        raise _Stop(signum)

    def repeat(_signum: int, _frame: object) -> None:
        print(
            "slidedp serve: still stopping (a running job is saving a checkpoint)",
            file=sys.stderr,
            flush=True,
        )

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data_dir = Path(os.environ.get("SLIDEDP_DATA_DIR") or ".slidedp").resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.environ["SLIDEDP_DATA_DIR"] = str(data_dir)
    _install_stop_handlers()
    try:
        _serve(args, data_dir)
    except _Stop:
        pass
    return 0


def _serve(args: argparse.Namespace, data_dir: Path) -> None:
    with contextlib.ExitStack() as stack:
        if not os.environ.get("REDIS_URL") and not args.api_only:
            os.environ["REDIS_URL"] = stack.enter_context(private_redis(data_dir))
        from slidedp_web.core.config import get_settings
        from slidedp_web.core.db import upgrade
        from slidedp_web.main import create_app

        get_settings.cache_clear()
        settings = get_settings()
        host = args.host or settings.host
        port = args.port or settings.port
        settings = confine_for_bind(settings, host, bool(args.allow_any_path))
        if not args.api_only:
            upgrade(settings)  # once, before the worker and the API both look at the schema
            # The worker never calls the API: it does not get the token.
            env = {**os.environ, **settings.env()}
            env.pop("SLIDEDP_API_TOKEN", None)
            worker = LocalWorker(env, data_dir / "worker.log", stop_timeout=settings.cancel_grace_s + 30)
            worker.start()
            stack.callback(worker.stop)
            threading.Thread(target=worker.watch, name="slidedp-worker-watch", daemon=True).start()
        print(
            f"SlideDP Workbench at http://{host}:{port}  (data: {data_dir}; database: "
            f"{settings.sqlalchemy_url.split('://')[0]}; Redis: {settings.redis_url}"
            + ("" if args.api_only else f"; worker log: {data_dir / 'worker.log'}")
            + ")",
            flush=True,
        )
        print(
            f"  port {port}, data folder {data_dir}; to change them: SLIDEDP_PORT=8080 (or --port), "
            "SLIDEDP_DATA_DIR=/path/to/folder",
            flush=True,
        )
        settings = apply_access(settings, host, port, bool(args.insecure), data_dir, stack)
        from slidedp_web import logs

        # JSON logs: uvicorn leaves its loggers unconfigured (log_config=None) and they reach the JSON root handler.
        json_logs = logs.log_format(settings.log_format) == "json"
        if json_logs:
            logs.configure("INFO", "json")
        kwargs = {"log_config": None} if json_logs else {}
        _run_api(create_app(settings), host, port, **kwargs)


def _run_api(app: object, host: str, port: int, **kwargs: object) -> None:
    """uvicorn.run, with a server that on the first Ctrl-C (or SIGTERM) also kills the plans being made:
    uvicorn's graceful shutdown waits for every request in flight, and a plan request would hold it for as long
    as planning takes (up to SLIDEDP_PLAN_TIMEOUT_S); killed, it answers 503 at once."""
    import uvicorn

    from slidedp_web import planning

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            planning.stop_planning()
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="info", **kwargs))
    server.run()
    if not server.started:
        raise SystemExit(f"slidedp serve: the API did not start on {host}:{port} (see the messages above)")


if __name__ == "__main__":
    sys.exit(main())
