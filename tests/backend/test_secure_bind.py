"""What a job may read and write follows the bind, as who may call the API does (test_auth_bind.py). On a
non-loopback address `slidedp serve` sets each root left unset to a folder of the data folder (models/, datasets/,
jobs/named/), makes them and prints them; `--allow-any-path` keeps them unset after a loud warning; loopback stays
unconfined. Servers on a non-loopback address run in a network namespace of their own (test_auth_bind.NetnsServer),
so nothing is exposed beyond this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backend_support import tiny_job, tokens_dataset, wait_for
from test_auth_bind import LAN, PORT, NetnsServer, clean_env, needs_netns, serve

TOKEN = {"Authorization": "Bearer secure-bind-token"}


def test_roots_for_bind_confines_only_a_network_bind_and_only_unset_roots(tmp_path):
    from slidedp_web.core.config import Settings, roots_for_bind

    def settings(**values) -> Settings:
        return Settings(_env_file=None, data_dir=tmp_path, **values)

    for host in ("127.0.0.1", "::1", "localhost"):
        assert roots_for_bind(settings(), host) == {}
    assert roots_for_bind(settings(), "0.0.0.0") == {
        "model_roots": tmp_path / "models",
        "data_roots": tmp_path / "datasets",
        "output_roots": tmp_path / "jobs" / "named",
    }
    assert roots_for_bind(settings(data_roots="/srv/data"), "10.0.0.5") == {
        "model_roots": tmp_path / "models",
        "output_roots": tmp_path / "jobs" / "named",
    }
    assert roots_for_bind(settings(allow_any_path=True), "0.0.0.0") == {}
    full = settings(model_roots="/m", data_roots="/d", output_roots="/o")
    assert roots_for_bind(full, "gpu-box") == {}


def _plan(server: NetnsServer, job: dict) -> tuple[int, dict]:
    [(code, body)] = server.requests(("POST", f"http://{LAN}:{PORT}/api/plan", TOKEN, job))
    return code, json.loads(body)


@needs_netns
@pytest.mark.timeout(300)
def test_serve_on_a_network_address_holds_jobs_to_the_data_folder(tmp_path):
    data = tmp_path / "data"
    outside = tokens_dataset(tmp_path / "home-secret.jsonl")
    env = clean_env(data, SLIDEDP_API_TOKEN="secure-bind-token")
    server = NetnsServer(serve("--host", "0.0.0.0", "--port", str(PORT)), env, tmp_path)
    try:
        server.wait_answering(TOKEN)
        err = server.stderr()
        for name, folder in (("MODEL", "models"), ("DATA", "datasets"), ("OUTPUT", "jobs/named")):
            assert f"SLIDEDP_{name}_ROOTS={data / folder}" in err, err
            assert (data / folder).is_dir()
        assert "--allow-any-path" not in err
        code, body = _plan(server, tiny_job(outside))
        assert code == 422 and [e["loc"] for e in body["detail"]] == [["body", "data", "path"]], body
        assert "is not inside the folders allowed for datasets" in body["detail"][0]["msg"]
        inside = tokens_dataset(data / "datasets" / "train.jsonl")
        code, body = _plan(server, tiny_job(inside))
        assert code == 200, body
        code, body = _plan(server, tiny_job(inside, eval={"path": str(outside)}))
        assert code == 422 and [e["loc"] for e in body["detail"]] == [["body", "eval", "path"]], body
        # A relative output folder goes under jobs/named/, never beside the database and the token.
        [(code, text)] = server.requests(
            ("POST", f"http://{LAN}:{PORT}/api/jobs", TOKEN, tiny_job(inside, output_dir="api-token"))
        )
        assert code == 201, text
        assert json.loads(text)["output_dir"] == str(data / "jobs" / "named" / "api-token")
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]


@needs_netns
@pytest.mark.timeout(300)
def test_serve_allow_any_path_leaves_jobs_unconfined_after_a_warning(tmp_path):
    data = tmp_path / "data"
    outside = tokens_dataset(tmp_path / "anywhere.jsonl")
    env = clean_env(data, SLIDEDP_API_TOKEN="secure-bind-token", SLIDEDP_MODEL_ROOTS=str(tmp_path))
    server = NetnsServer(serve("--api-only", "--host", "0.0.0.0", "--port", str(PORT), "--allow-any-path"), env,
                         tmp_path)  # fmt: skip
    try:
        server.wait_answering(TOKEN)
        err = server.stderr()
        assert "WARNING: --allow-any-path / SLIDEDP_ALLOW_ANY_PATH" in err
        assert "SLIDEDP_DATA_ROOTS, SLIDEDP_OUTPUT_ROOTS are not set" in err
        assert "_ROOTS=" not in err and not (data / "datasets").exists()
        code, body = _plan(server, tiny_job(outside))
        assert code == 200, body
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]


@needs_netns
@pytest.mark.timeout(300)
def test_serve_refuses_clearly_when_the_token_file_is_a_folder(tmp_path):
    """A folder where the generated token is written (an output folder an older version let a job make there)
    stops the start with a message, not an IsADirectoryError."""
    data = tmp_path / "data"
    (data / "api-token").mkdir(parents=True)
    (data / "api-token" / "metrics.jsonl").write_text("{}\n")
    server = NetnsServer(serve("--api-only", "--host", "0.0.0.0", "--port", str(PORT)), clean_env(data), tmp_path)
    try:
        wait_for(lambda: server.proc.poll() is not None, 90, "slidedp serve to stop")
        err = server.stderr()
        assert server.proc.returncode != 0
        assert f"{data / 'api-token'} is a folder, where the generated API token is written" in err, err
        assert "Traceback" not in err and "IsADirectoryError" not in err
        assert (data / "api-token" / "metrics.jsonl").read_text() == "{}\n"  # left as it was
    finally:
        server.stop()


def test_the_compose_file_sets_every_root(tmp_path):
    """docker-compose.yml serves the API on 0.0.0.0 with roots of its own (mounted folders), so the defaults
    above never move its jobs' folders."""
    text = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    for line in ("SLIDEDP_MODEL_ROOTS: /models", "SLIDEDP_DATA_ROOTS: /datasets", "SLIDEDP_OUTPUT_ROOTS: /runs"):
        assert line in text
