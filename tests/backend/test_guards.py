"""Guards: model and dataset roots (422 naming `model` / `data.path`, `..` and symlinks resolved), request size
(413), and the job process refusing, before it allocates anything, a job its host cannot hold: host RAM, GPU
memory, shared memory, and (the runtime's check) the disk a checkpoint needs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from backend_support import ApiServer, WorkerProcess, make_settings, tiny_job, tokens_dataset, wait_status
from fault_support import NamespacedWorker, segments, userns_mounts_work

ROOTS_MSG = "is not inside the folders allowed"


@pytest.fixture(scope="module")
def roots(module_dir) -> dict[str, Path]:
    base = module_dir / "roots"
    out = {name: base / name for name in ("models", "datasets", "outputs", "elsewhere")}
    for path in out.values():
        path.mkdir(parents=True)
    return out


@pytest.fixture(scope="module")
def settings(module_dir, redis_server, roots):
    return make_settings(
        module_dir / "data",
        redis_server.url,
        model_roots=f"{roots['models']}:{module_dir / 'no-such-folder'}",
        data_roots=str(roots["datasets"]),
        output_roots=str(roots["outputs"]),
    )


def model_dir(path: Path) -> Path:
    """What the API checks of a Hugging Face directory: config.json (tiny-qwen3's) and a weights file."""
    from slidedp.presets import PRESETS

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(PRESETS["tiny-qwen3"]))
    (path / "model.safetensors").write_bytes(b"")
    return path


def refused(resp: httpx.Response, loc: list) -> str:
    assert resp.status_code == 422, resp.text
    detail = {tuple(e["loc"]): e["msg"] for e in resp.json()["detail"]}
    assert tuple(loc) in detail, detail
    return detail[tuple(loc)]


def test_datasets_outside_the_data_roots_are_refused_naming_data_path(client, roots, redis_server, settings):
    inside = tokens_dataset(roots["datasets"] / "train.jsonl")
    outside = tokens_dataset(roots["elsewhere"] / "train.jsonl")
    (roots["datasets"] / "link.jsonl").symlink_to(outside)

    assert client.post("/api/jobs", json=tiny_job(inside)).status_code == 201
    msg = refused(client.post("/api/jobs", json=tiny_job(outside)), ["body", "data", "path"])
    assert ROOTS_MSG in msg and str(roots["datasets"]) in msg and "SLIDEDP_DATA_ROOTS" in msg
    dotdot = f"{roots['datasets']}/../elsewhere/train.jsonl"
    msg = refused(client.post("/api/jobs", json=tiny_job(dotdot)), ["body", "data", "path"])
    assert ROOTS_MSG in msg and "after '~', '..' and symlinks are resolved" in msg
    link = roots["datasets"] / "link.jsonl"
    msg = refused(client.post("/api/jobs", json=tiny_job(link)), ["body", "data", "path"])
    assert ROOTS_MSG in msg and str(outside) not in msg  # where the link leads is not told
    # A refusal reads the same whether the path outside exists or not: it cannot be used to map files.
    missing = roots["elsewhere"] / "no-such.jsonl"
    answers = [
        refused(client.post("/api/jobs", json=tiny_job(p)), ["body", "data", "path"])
        for p in (outside, missing)
    ]
    assert answers[0].replace(str(outside), "P") == answers[1].replace(str(missing), "P")
    # The plan preview reads the same files: refused the same way.
    refused(client.post("/api/plan", json=tiny_job(outside)), ["body", "data", "path"])
    assert client.get("/api/jobs").json()["total"] == 1
    assert redis_server.client().llen(settings.queue) == 1


def test_models_outside_the_model_roots_are_refused_naming_model(client, roots):
    data = tokens_dataset(roots["datasets"] / "m.jsonl")
    inside = model_dir(roots["models"] / "tiny")
    outside = model_dir(roots["elsewhere"] / "tiny")
    leaky = model_dir(roots["models"] / "leaky")
    (leaky / "tokenizer.json").symlink_to(roots["elsewhere"] / "secret.json")

    assert client.post("/api/jobs", json=tiny_job(data, model=str(inside))).status_code == 201
    assert client.post("/api/jobs", json=tiny_job(data)).status_code == 201  # a preset names no path
    msg = refused(client.post("/api/jobs", json=tiny_job(data, model=str(outside))), ["body", "model"])
    assert ROOTS_MSG in msg and "SLIDEDP_MODEL_ROOTS" in msg
    escape = f"{roots['models']}/../elsewhere/tiny"
    assert ROOTS_MSG in refused(
        client.post("/api/jobs", json=tiny_job(data, model=escape)), ["body", "model"]
    )
    msg = refused(client.post("/api/jobs", json=tiny_job(data, model=str(leaky))), ["body", "model"])
    assert "holds a symlink" in msg and "tokenizer.json" in msg and "secret.json" not in msg
    # Both fields at once, each named.
    resp = client.post("/api/jobs", json=tiny_job(roots["elsewhere"] / "x.jsonl", model=str(outside)))
    assert ROOTS_MSG in refused(resp, ["body", "model"])
    assert ROOTS_MSG in refused(resp, ["body", "data", "path"])


def test_output_dirs_outside_the_output_roots_and_the_data_dir_are_refused(client, roots, settings):
    data = tokens_dataset(roots["datasets"] / "o.jsonl")
    ok = client.post("/api/jobs", json={**tiny_job(data), "output_dir": str(roots["outputs"] / "run1")})
    assert ok.status_code == 201 and ok.json()["output_dir"] == str(roots["outputs"] / "run1")
    relative = client.post(
        "/api/jobs", json={**tiny_job(data), "output_dir": "runs/r2"}
    )  # under the first root
    assert relative.status_code == 201, relative.text
    assert relative.json()["output_dir"] == str(roots["outputs"] / "runs" / "r2")
    default = client.post("/api/jobs", json=tiny_job(data))  # the job's own folder in the data folder
    assert default.json()["output_dir"] == str(settings.jobs_dir / str(default.json()["id"]))
    msg = refused(
        client.post("/api/jobs", json={**tiny_job(data), "output_dir": str(roots["elsewhere"] / "r")}),
        ["body", "output_dir"],
    )
    assert ROOTS_MSG in msg and "SLIDEDP_OUTPUT_ROOTS" in msg and str(roots["outputs"]) in msg
    msg = refused(
        client.post("/api/jobs", json={**tiny_job(data), "output_dir": "../../escape"}),
        ["body", "output_dir"],
    )
    assert ROOTS_MSG in msg
    # The data folder is no longer exempt from the roots: not even a folder of the jobs root.
    for inside_data in (str(settings.data_dir / "mine"), str(settings.jobs_dir / "999")):
        refused(
            client.post("/api/jobs", json={**tiny_job(data), "output_dir": inside_data}),
            ["body", "output_dir"],
        )


def test_output_roots_take_relative_dirs_under_the_first_root(roots, tmp_path):
    from slidedp_web.guards import root_errors

    assert root_errors(None, None, {"output_dir": "jobs/7"}, str(roots["outputs"]), tmp_path) == []
    assert root_errors(None, None, {"output_dir": "/tmp/anything"}, None, tmp_path) == []  # unset: unconfined
    escape = root_errors(None, None, {"output_dir": "../x"}, str(roots["outputs"]), tmp_path)
    assert [e["loc"] for e in escape] == ["output_dir"]
    data_dir = root_errors(
        None, None, {"output_dir": str(tmp_path / "jobs" / "7")}, str(roots["outputs"]), tmp_path
    )
    assert [e["loc"] for e in data_dir] == ["output_dir"]


def test_without_roots_any_readable_path_is_accepted_and_demo_data_always_is(roots):
    from slidedp_web.guards import root_errors

    anywhere = tokens_dataset(roots["elsewhere"] / "free.jsonl")
    config = tiny_job(anywhere, model=str(model_dir(roots["elsewhere"] / "free-model")))
    assert root_errors(None, None, config) == []
    assert root_errors("", "", config) == []
    confined = root_errors(str(roots["models"]), str(roots["datasets"]), config)
    assert [e["loc"] for e in confined] == ["model", "data.path"]
    # Datasets shipped with slidedp live in the installation, not on the host's disks.
    assert root_errors(None, str(roots["datasets"]), tiny_job("demo:demo_sft.jsonl")) == []


def test_request_bodies_over_1_mib_are_refused_with_413(client, roots):
    data = tokens_dataset(roots["datasets"] / "size.jsonl")
    body = json.dumps(tiny_job(data)).encode()
    limit = 1 << 20
    padded = body[:-1] + b" " * (limit - len(body)) + b"}"  # exactly the limit: accepted
    assert len(padded) == limit
    assert (
        client.post("/api/jobs", content=padded, headers={"content-type": "application/json"}).status_code
        == 201
    )

    before = client.get("/api/jobs").json()["total"]
    big = body[:-1] + b" " * (limit + 1 - len(body)) + b"}"
    resp = client.post("/api/jobs", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["detail"].startswith(
        f"request body too large: {limit + 1} bytes, at most {limit} bytes"
    )
    assert "SLIDEDP_MAX_REQUEST_BYTES" in resp.json()["detail"]

    def chunks():  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 64 * 1024):
            yield big[i : i + 64 * 1024]

    resp = client.post("/api/plan", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "request body too large" in resp.json()["detail"]
    assert client.get("/api/jobs").json()["total"] == before


def test_gpu_memory_is_checked_even_for_a_fully_explicit_policy():
    """The runtime plans only policies with something left to choose; the job process's guard prices every one
    with AutoPolicy's memory model, here on the nvidia-h200-x2 machine's reported topology."""
    from slidedp.config import JobConfig
    from slidedp_web.preflight import resource_errors

    fixture = Path(__file__).resolve().parents[1] / "runtime" / "fixtures" / "h200x2_topology.json"
    topology = json.loads(fixture.read_text())["nvlink"]
    job = {
        "model": "qwen3-8b",
        "data": {"path": "x.jsonl"},
        "gpus": 2,
        "micro_batch_size": 8,
        "seq_len": 2048,
    }
    explicit = {"delivery": "sharded", "grad_reduce": "gpu", "activations": "keep", "resident_units": 0}
    errors = resource_errors(JobConfig.from_dict({**job, "policy": explicit}), topology, "/")
    assert [e["loc"] for e in errors] == ["policy.activations"]
    assert "GiB of HBM per GPU" in errors[0]["msg"] and "over the budget" in errors[0]["msg"]
    too_big = resource_errors(JobConfig.from_dict({**job, "model": "qwen3-32b"}), topology, "/")
    assert [e["loc"] for e in too_big] == ["model"] and "host RAM too small" in too_big[0]["msg"]


def test_a_gpu_job_on_a_host_without_a_detector_report_is_left_to_the_runtime(settings, tmp_path):
    """The basic probe knows the host's RAM, not its GPUs: refusing for "0 GPUs" would be wrong there."""
    from slidedp_web.hosts import basic_topology
    from slidedp_web.preflight import preflight

    job = tiny_job("demo:demo_sft.jsonl", gpus=1)
    assert preflight(settings, job, basic_topology(settings)) == []
    assert preflight(settings, job, None) == []
    detected = {**basic_topology(settings), "source": "slidedp.planning.topology"}
    assert [e["loc"] for e in preflight(settings, job, detected)] == ["gpus"]


@pytest.mark.slow
def test_job_process_refuses_a_job_beyond_its_hosts_ram_before_allocating(module_dir, redis_server):
    """Queued before its host reported (so the API could not check it), refused when the worker, which may give
    jobs 1 MiB (SLIDEDP_HOST_RAM_GIB), starts it; afterwards the API refuses such a job at once."""
    settings = make_settings(module_dir / "data-ram", redis_server.url)
    shm = module_dir / "shm-ram"
    shm.mkdir()
    data = tokens_dataset(module_dir / "ram.jsonl")
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as client:
        job = client.post("/api/jobs", json=tiny_job(data)).json()
        worker = WorkerProcess(
            settings,
            module_dir / "worker-ram.log",
            extra_env={"SLIDEDP_HOST_RAM_GIB": str(1 / 1024), "SLIDEDP_SHM_DIR": str(shm)},
        ).start()
        try:
            done = wait_status(client, job["id"], ("failed", "completed"), timeout=60)
            assert done["status"] == "failed"
            assert done["error"]["message"].startswith(
                f"refused before start on {settings.host_name}: model: "
            )
            [error] = done["error"]["errors"]
            assert error["loc"] == "model" and "host RAM too small" in error["msg"]
            assert "0.0 GiB available" in error["msg"]
            lines = [e["line"] for e in client.get(f"/api/jobs/{job['id']}/logs").json()["items"]]
            assert done["error"]["message"] in lines
            assert client.get(f"/api/jobs/{job['id']}/metrics").json()["items"] == []
            assert segments(shm) == [] and done["checkpoints"] == []
            # Now that the host has reported what it has, the API refuses the same job at once.
            assert "host RAM too small" in refused(
                client.post("/api/jobs", json=tiny_job(data)), ["body", "model"]
            )
        finally:
            worker.stop()


@pytest.mark.slow
@pytest.mark.skipif(
    not userns_mounts_work(), reason="needs unprivileged user and mount namespaces (unshare -Urm)"
)
def test_too_little_shared_memory_or_checkpoint_disk_fails_the_job_before_allocating(
    module_dir, redis_server
):
    """A worker whose /dev/shm stand-in has 6 MiB free (Docker's default is 64 MiB) and a job output folder on a
    2 MiB filesystem: the demo model's host state (12 MB) is refused by the job process, the tiny model's (3 MB)
    fits, but its checkpoints (3 MB each) do not fit the output folder: the runtime refuses at start."""
    settings = make_settings(module_dir / "data-small", redis_server.url)
    shm, small = module_dir / "shm-small", module_dir / "small-disk"
    shm.mkdir()
    small.mkdir()
    data = tokens_dataset(module_dir / "small.jsonl")
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as client:
        demo = client.post("/api/jobs", json=tiny_job(data, model="demo-qwen3")).json()
        tiny = client.post(
            "/api/jobs", json=tiny_job(data, output_dir=str(small / "run"), checkpoint={"interval": 1})
        ).json()
        worker = NamespacedWorker(
            settings,
            module_dir / "worker-small.log",
            mounts={shm: "6m", small: "2m"},
            extra_env={"SLIDEDP_SHM_DIR": str(shm)},
        ).start()
        try:
            refused_demo = wait_status(client, demo["id"], ("failed", "completed"), timeout=60)
            [error] = refused_demo["error"]["errors"]
            assert error["loc"] == "model" and error["msg"].startswith(
                "shared memory too small: the host state"
            )
            assert f"in {shm} but only" in error["msg"] and "shm_size" in error["msg"]

            no_disk = wait_status(client, tiny["id"], ("failed", "completed"), timeout=90)
            assert no_disk["status"] == "failed", no_disk
            [error] = no_disk["error"]["errors"]
            assert error["loc"] == "checkpoint.interval"
            assert error["msg"].startswith("a checkpoint needs") and f"in {small / 'run'}" in error["msg"]
            assert "set checkpoint.interval to 0" in error["msg"]
            assert no_disk["error"]["message"] == f"the job cannot start: checkpoint.interval: {error['msg']}"
            assert client.get(f"/api/jobs/{tiny['id']}/metrics").json()["items"] == []
        finally:
            worker.stop()
    assert os.listdir(shm) == []  # the mounts lived in the worker's namespace only
