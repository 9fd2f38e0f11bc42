"""Who may call the API follows its bind. Servers that bind a non-loopback address run in a network namespace of
their own (`unshare -n`, holding only `lo`, with 10.77.0.1 added to it as a stand-in for a LAN address) and are
called from inside it (`nsenter`), so nothing is exposed beyond this machine.

- `slidedp serve --host 0.0.0.0` without SLIDEDP_API_TOKEN generates a token, prints a login URL once on stderr,
  and refuses unauthenticated calls; the URL's token works as a bearer header.
- `--insecure` serves without a token, after a loud warning.
- a plain `uvicorn slidedp_web.main:app --host 0.0.0.0` (no token) answers loopback connections only, unless
  SLIDEDP_INSECURE=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from backend_support import tiny_job, tokens_dataset, wait_for
from slidedp_web.core.config import access_for_bind, base_url, is_loopback, login_url

LAN = "10.77.0.1"  # an address on the namespace's lo that is not a loopback address
PORT = 8000  # free: the namespace is the server's own
LOGIN = re.compile(r"http://\S+:8000/#token=([A-Za-z0-9_-]+)")


def _netns_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "-n", "--", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(not _netns_works(), reason="needs root for unshare -n / nsenter")

CLIENT = r"""
import json, sys, urllib.error, urllib.request
out = []
for method, url, headers, body in json.loads(sys.argv[1]):
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            out.append([r.status, r.read().decode(errors="replace")])
    except urllib.error.HTTPError as e:
        out.append([e.code, e.read().decode(errors="replace")])
    except OSError as e:
        out.append([0, repr(e)])
print(json.dumps(out))
"""


class NetnsServer:
    """A command in a new network namespace (lo up, plus LAN on lo), stdout and stderr captured apart."""

    def __init__(self, argv: list[str], env: dict[str, str], workdir: Path):
        self.out, self.err = workdir / "server.out", workdir / "server.err"
        setup = f'ip link set lo up && ip addr add {LAN}/32 dev lo && exec "$@"'
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                ["unshare", "-n", "--", "sh", "-c", setup, "sh", *argv],
                env=env, cwd=str(workdir), stdout=out, stderr=err, start_new_session=True,
            )  # fmt: skip

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def requests(self, *reqs: tuple) -> list[tuple[int, str]]:
        """(method, url, headers, json body or None) each, made from inside the namespace."""
        batch = [[m, u, h or {}, b] for m, u, h, b in reqs]
        proc = subprocess.run(
            ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", sys.executable, "-c", CLIENT, json.dumps(batch)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [tuple(x) for x in json.loads(proc.stdout)]

    def status(self, method: str, url: str, headers: dict | None = None, body=None) -> int:
        return self.requests((method, url, headers, body))[0][0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def wait_answering(self, headers: dict | None = None, host: str = "127.0.0.1") -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited:\n{self.stderr()[-3000:]}\n{self.stdout()[-2000:]}")
            return self.status("GET", f"http://{host}:{PORT}/api/health", headers) == 200

        wait_for(up, 90, "the server to answer", interval=0.5)


def clean_env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLIDEDP_", "DATABASE_URL", "REDIS_URL"))}
    env.update(SLIDEDP_DATA_DIR=str(data), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo")
    env.update(extra)
    return env


def serve(*args: str) -> list[str]:
    """`slidedp serve ...` through the real command line."""
    return [
        sys.executable,
        "-c",
        "import sys; from slidedp.cli import main; sys.exit(main())",
        "serve",
        *args,
    ]


@needs_netns
@pytest.mark.timeout(300)
def test_serve_on_all_addresses_without_a_token_generates_one(tmp_path):
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)  # where a network bind without roots lets jobs read datasets
    dataset = tokens_dataset(data / "datasets" / "tokens.jsonl")
    server = NetnsServer(serve("--host", "0.0.0.0", "--port", str(PORT)), clean_env(data), tmp_path)
    try:
        match = wait_for(lambda: LOGIN.search(server.stderr()) or server.proc.poll() is not None, 90,
                         "the login URL on stderr")  # fmt: skip
        assert match is not True, server.stderr()
        token = match.group(1)
        assert len(token) >= 32
        bearer = {"Authorization": f"Bearer {token}"}
        server.wait_answering(bearer)

        job = tiny_job(dataset)
        results = server.requests(
            ("GET", f"http://127.0.0.1:{PORT}/api/jobs", None, None),
            ("POST", f"http://127.0.0.1:{PORT}/api/plan", None, job),
            ("GET", f"http://{LAN}:{PORT}/api/jobs", None, None),
            ("POST", f"http://{LAN}:{PORT}/api/plan", None, job),
            ("GET", f"http://{LAN}:{PORT}/api/health", None, None),
            ("GET", f"http://{LAN}:{PORT}/api/jobs?access_token={token}", None, None),
            ("GET", f"http://{LAN}:{PORT}/api/jobs", {"Authorization": "Bearer wrong"}, None),
            ("GET", f"http://{LAN}:{PORT}/api/jobs", bearer, None),
            ("POST", f"http://{LAN}:{PORT}/api/plan", bearer, job),
            ("GET", f"http://{LAN}:{PORT}/metrics", None, None),
        )
        codes = [code for code, _ in results]
        assert codes == [401, 401, 401, 401, 401, 401, 401, 200, 200, 401], results
        assert json.loads(results[7][1])["items"] == []
        assert json.loads(results[8][1])["validation"] == []

        err = server.stderr()
        assert err.count(token) == 1, "the token is printed once"
        assert f"http://{os.uname().nodename}:{PORT}/#token={token}" in err
        for name, folder in (("MODEL", "models"), ("DATA", "datasets"), ("OUTPUT", "jobs/named")):
            assert f"SLIDEDP_{name}_ROOTS={data / folder}" in err  # confined to the data folder, and told so
        assert token not in server.stdout()
        token_file = data / "api-token"
        assert token_file.read_text().strip() == token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    finally:
        code = server.stop()
    assert code == 0, server.stderr()[-3000:]
    assert not (data / "api-token").exists(), "the token file goes with the server"
    # The token reached neither the worker's environment and log nor any other file of the data directory.
    for path in data.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


@needs_netns
@pytest.mark.timeout(300)
def test_serve_insecure_answers_without_a_token_after_a_warning(tmp_path):
    data = tmp_path / "data"
    server = NetnsServer(serve("--host", "0.0.0.0", "--port", str(PORT), "--insecure"),
                         clean_env(data, SLIDEDP_MODEL_ROOTS=str(tmp_path)), tmp_path)  # fmt: skip
    try:
        server.wait_answering()
        assert server.status("GET", f"http://{LAN}:{PORT}/api/jobs") == 200
        assert server.status("GET", f"http://127.0.0.1:{PORT}/api/jobs") == 200
        err = server.stderr()
        assert "WARNING: --insecure / SLIDEDP_INSECURE" in err and "ANYONE" in err
        assert not LOGIN.search(err) and "#token=" not in err
        # Roots: only the unset ones are given the data folder's.
        assert f"SLIDEDP_DATA_ROOTS={data / 'datasets'}" in err and "SLIDEDP_MODEL_ROOTS=" not in err
        assert f"SLIDEDP_OUTPUT_ROOTS={data / 'jobs' / 'named'}" in err
        assert not (data / "api-token").exists()
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]


@needs_netns
@pytest.mark.timeout(300)
def test_serve_keeps_a_configured_token_and_prints_none(tmp_path):
    data = tmp_path / "data"
    env = clean_env(data, SLIDEDP_API_TOKEN="configured-token-123", SLIDEDP_MODEL_ROOTS="/m",
                    SLIDEDP_DATA_ROOTS="/d", SLIDEDP_OUTPUT_ROOTS="/o")  # fmt: skip
    server = NetnsServer(serve("--api-only", "--host", "0.0.0.0", "--port", str(PORT)), env, tmp_path)
    try:
        server.wait_answering({"Authorization": "Bearer configured-token-123"})
        assert server.status("GET", f"http://{LAN}:{PORT}/api/jobs") == 401
        err = server.stderr()
        assert "#token=" not in err and "configured-token-123" not in err + server.stdout()
        assert "WARNING" not in err  # a token, and every root set
        assert not (data / "api-token").exists()
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]


@needs_netns
@pytest.mark.timeout(300)
@pytest.mark.parametrize("insecure", [False, True], ids=["default", "SLIDEDP_INSECURE"])
def test_plain_uvicorn_on_all_addresses_answers_loopback_only(tmp_path, insecure):
    """`uvicorn slidedp_web.main:app --host 0.0.0.0` cannot know its bind: without a token it refuses (403) every
    connection that came in on a non-loopback address, unless SLIDEDP_INSECURE=1."""
    env = clean_env(tmp_path / "data", **({"SLIDEDP_INSECURE": "1"} if insecure else {}))
    argv = [sys.executable, "-m", "uvicorn", "slidedp_web.main:app", "--host", "0.0.0.0", "--port", str(PORT)]
    server = NetnsServer(argv, env, tmp_path)
    try:
        server.wait_answering()
        (lan, lan_metrics, local) = server.requests(
            ("GET", f"http://{LAN}:{PORT}/api/jobs", None, None),
            ("GET", f"http://{LAN}:{PORT}/metrics", None, None),
            ("GET", f"http://127.0.0.1:{PORT}/api/jobs", None, None),
        )
        assert local[0] == 200
        if insecure:
            assert lan[0] == 200 and lan_metrics[0] == 200
        else:
            assert lan[0] == 403 and lan_metrics[0] == 403
            assert "SLIDEDP_API_TOKEN" in json.loads(lan[1])["detail"]
    finally:
        server.stop()


def test_access_for_bind_decides_the_token():
    for host in ("127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
        access = access_for_bind(host, None)
        assert access.token is None and access.loopback and not access.generated
        assert access_for_bind(host, "set").token == "set"
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "fe80::1", "gpu-box", "example.org"):
        assert not is_loopback(host), host
        first, second = access_for_bind(host, None), access_for_bind(host, None)
        assert first.generated and first.token and len(first.token) >= 40 and first.token != second.token
        assert not first.loopback and not first.insecure
        configured = access_for_bind(host, "set", insecure=True)
        assert configured.token == "set" and not configured.generated and not configured.insecure
        open_ = access_for_bind(host, None, insecure=True)
        assert open_.token is None and open_.insecure and not open_.generated
    assert base_url("10.0.0.5", 8000) == "http://10.0.0.5:8000"
    assert base_url("fe80::1", 8000) == "http://[fe80::1]:8000"
    assert base_url("0.0.0.0", 8000, "http://gpu-box:8080/") == "http://gpu-box:8080"
    assert login_url("http://gpu-box:8080", "abc") == "http://gpu-box:8080/#token=abc"
