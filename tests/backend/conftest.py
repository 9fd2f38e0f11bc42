"""Fixtures of the backend tests: real Redis, the real API over HTTP, a real Celery worker process running the
real runtime on a tiny model on the CPU. Settings are built per test module with a private data directory."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from backend_support import ApiServer, RedisServer, WorkerProcess, make_settings, tokens_dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> RedisServer:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("backend")


@pytest.fixture(scope="module")
def settings(module_dir, redis_server):
    return make_settings(module_dir / "data", redis_server.url)


@pytest.fixture(scope="module")
def api(settings):
    with ApiServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api):
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def worker(settings, module_dir, api):
    proc = WorkerProcess(settings, module_dir / "worker.log").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def dataset(module_dir) -> Path:
    return tokens_dataset(module_dir / "tokens.jsonl")
