"""Jobs own their folders: against the real API, a real Redis and a real worker training the tiny model on the CPU.

Each case is one a user or a client on a shared workstation could trigger: a job that names the jobs root or the
data folder, two jobs on one folder (also sent at the same moment, and queued together before either folder
exists), DELETE of a job whose recorded folder overlaps others (rows from before folders were owned), files put
into an export by hand, and a job whose folder was claimed by another."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from backend_support import post_at_once, tiny_job, wait_status

# Real jobs on a real worker: part of `make test`, not of the quick `make test-fast`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def no_queued_job_left(client):
    """Cancel what a test left queued: the module's worker starts at its first test that needs one and would run
    the jobs earlier tests only submitted before that test's own (four tiny jobs ahead of one took it past its
    wait on a loaded 2-core machine)."""
    yield
    for job in client.get("/api/jobs", params={"status": "queued", "limit": 100}).json()["items"]:
        client.post(f"/api/jobs/{job['id']}/cancel")


def conflict(resp) -> dict:
    assert resp.status_code == 409, resp.text
    [item] = resp.json()["detail"]
    assert item["loc"] == ["body", "output_dir"] and item["type"] == "conflict", item
    return item


def insert_legacy_job(settings, output_dir: str, status: str = "completed") -> int:
    """A row as the workbench wrote it before folders were owned (no owner token, nothing recorded)."""
    from slidedp_web.core.db import write_session
    from slidedp_web.models import JobRecord, utcnow

    with write_session(settings) as ws:
        job = JobRecord(
            status=status,
            config={"model": "tiny-qwen3", "output_dir": output_dir},
            queue=settings.queue,
            created_at=utcnow(),
            steps=4,
            output_dir=output_dir,
        )
        ws.add(job)
        ws.flush()
        return int(job.id)


def test_the_data_folder_and_the_jobs_root_are_no_job_s_folder(client, dataset, settings):
    data = Path(settings.data_dir)
    for value in (".", str(data), str(data / "jobs"), str(data / "jobs" / "123"), str(data / "jobs" / "named"),
                  str(data.parent)):
        item = conflict(client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": value}))
        assert "leave output_dir out" in item["msg"], (value, item)
    assert client.get("/api/jobs").json()["total"] == 0
    # a relative folder is a folder of its own under <data>/jobs/named/, whatever its name
    own = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": "jobs"})
    assert own.status_code == 201 and own.json()["output_dir"] == str(data.resolve() / "jobs" / "named" / "jobs")


def test_a_folder_another_job_recorded_is_refused_naming_that_job(client, dataset, tmp_path):
    first = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(tmp_path / "run")}).json()
    for value in (tmp_path / "run", tmp_path / "run" / "inner", tmp_path):
        item = conflict(client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(value)}))
        assert item["job_id"] == first["id"] and f"belongs to job {first['id']}" in item["msg"]
        assert "init_from" in item["msg"]
    own = client.post("/api/jobs", json=tiny_job(dataset)).json()  # the default folder is the job's own
    item = conflict(client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": own["output_dir"]}))
    assert "leave output_dir out" in item["msg"]


def test_two_requests_for_one_new_folder_at_once_create_one_job(client, dataset, tmp_path, settings):
    folder = str(tmp_path / "race" / "run")
    answers = post_at_once(str(client.base_url), "/api/jobs", {**tiny_job(dataset), "output_dir": folder}, 6)
    assert sorted(answers) == [201] + [409] * 5, answers
    assert not Path(folder).exists()  # nothing is written before a worker claims it


def test_a_folder_with_files_no_job_wrote_is_refused(client, dataset, tmp_path):
    folder = tmp_path / "someone"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    resp = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(folder)})
    assert resp.status_code == 409 and "already holds files" in resp.json()["detail"][0]["msg"]
    assert (folder / "notes.txt").read_text() == "mine"


def test_delete_removes_only_what_the_job_wrote_even_when_its_recorded_folder_overlaps(
    client, dataset, settings, worker, tmp_path
):
    # Two real jobs: one in its own folder, one in a folder the user named, holding a file of the user's.
    own = client.post("/api/jobs", json={**tiny_job(dataset), "checkpoint": {"interval": 2}}).json()
    named_dir = tmp_path / "named"
    named = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(named_dir)}).json()
    for job in (own, named):
        assert wait_status(client, job["id"], ("completed", "failed"))["status"] == "completed"
    (named_dir / "user-notes.txt").write_text("keep me")
    own_files = sorted(p.relative_to(own["output_dir"]) for p in Path(own["output_dir"]).rglob("*"))
    assert Path("checkpoints") in own_files and Path("final") in own_files
    assert Path("tensorboard") in own_files  # the default tracker's event files (config report_to)

    # Rows written before folders were owned: one job recorded the jobs root, one the data folder itself.
    for legacy_dir in (settings.jobs_dir, settings.data_dir):
        legacy = insert_legacy_job(settings, str(legacy_dir))
        assert client.delete(f"/api/jobs/{legacy}").status_code == 204
        assert (
            sorted(p.relative_to(own["output_dir"]) for p in Path(own["output_dir"]).rglob("*")) == own_files
        )
        assert (Path(settings.data_dir) / "slidedp.db").exists()

    assert client.delete(f"/api/jobs/{named['id']}").status_code == 204
    assert sorted(os.listdir(named_dir)) == ["user-notes.txt"]  # the user's file and the folder stay
    assert client.delete(f"/api/jobs/{own['id']}").status_code == 204
    assert not Path(own["output_dir"]).exists()  # the job created its folder: it goes once empty
    assert Path(settings.jobs_dir).is_dir()  # never a parent


def test_jobs_queued_on_one_folder_before_either_exists_run_one_and_refuse_the_other(
    client, dataset, settings, worker, tmp_path
):
    """Rows that share a folder (written by an older workbench, or by a second API on the same database that
    does not lock): the worker checks the rows again and claims the folder with a marker before writing."""
    from slidedp_web.core.db import write_session
    from slidedp_web.models import JobRecord

    folder = tmp_path / "shared-late"
    a = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(folder / "a")}).json()
    b = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(folder / "b")}).json()
    with write_session(settings) as ws:  # b's row is made to name a's folder behind the API's back
        row = ws.get(JobRecord, b["id"])
        row.output_dir = str(folder / "a")
        row.config = {**row.config, "output_dir": str(folder / "a")}
        ws.add(row)
    done = {j["id"]: wait_status(client, j["id"], ("completed", "failed")) for j in (a, b)}
    assert [done[a["id"]]["status"], done[b["id"]]["status"]] == ["completed", "failed"]
    assert f"belongs to job {a['id']}" in done[b["id"]]["error"]["message"]
    marker = json.loads((folder / "a" / ".slidedp-job.json").read_text())
    assert marker["job_id"] == a["id"]


def test_a_folder_marked_by_another_job_is_not_written(client, dataset, settings, worker, tmp_path):
    folder = tmp_path / "marked"
    folder.mkdir()
    job = client.post("/api/jobs", json={**tiny_job(dataset), "output_dir": str(folder)}).json()
    (folder / ".slidedp-job.json").write_text(json.dumps({"job_id": 999, "owner_token": "not-this-job"}))
    done = wait_status(client, job["id"], ("completed", "failed"))
    assert done["status"] == "failed" and "marked as the folder of job 999" in done["error"]["message"]
    assert os.listdir(folder) == [".slidedp-job.json"]


def test_a_job_s_own_marker_lets_its_next_attempt_in_and_no_other(tmp_path):
    from slidedp_web import outputs

    folder = tmp_path / "a" / "b"
    assert outputs.claim(folder, 7, "t0ken") == [str(tmp_path / "a"), str(folder)]
    (folder / "metrics.jsonl").write_text("{}\n")
    assert outputs.claim(folder, 7, "t0ken") == []  # the retry: its own marker, its own files
    with pytest.raises(outputs.FolderRefused, match="marked as the folder of job 7"):
        outputs.claim(folder, 8, "other")
    (folder / ".slidedp-job.json").unlink()
    with pytest.raises(outputs.FolderRefused, match="already holds files this job did not write"):
        outputs.claim(folder, 7, "t0ken")


def test_the_download_holds_only_the_files_the_export_wrote(client, dataset, worker):
    job = client.post("/api/jobs", json=tiny_job(dataset)).json()
    assert wait_status(client, job["id"], ("completed", "failed"))["status"] == "completed"
    final = Path(job["output_dir"]) / "final"
    written = sorted(os.listdir(final))
    (final / "planted.txt").write_text("not the job's")
    (final / "tokenizer_extra.json").symlink_to("/etc/passwd")
    resp = client.get(f"/api/jobs/{job['id']}/export")
    assert resp.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        names = sorted(m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile())
    assert names == written and "planted.txt" not in names
    # A file the export wrote, replaced by a link to elsewhere, is not followed.
    target = final / written[0]
    target.unlink()
    target.symlink_to("/etc/hostname")
    resp = client.get(f"/api/jobs/{job['id']}/export")
    assert resp.status_code == 409 and "not a regular file" in resp.json()["detail"]


def test_init_from_starts_a_new_job_from_another_job_s_checkpoint(client, dataset, worker):
    source = client.post(
        "/api/jobs", json={**tiny_job(dataset), "checkpoint": {"interval": 2, "keep": 2}}
    ).json()
    assert wait_status(client, source["id"], ("completed", "failed"))["status"] == "completed"
    ckpt = Path(source["output_dir"]) / "checkpoints" / "step-00000004"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    bad = client.post(
        "/api/jobs", json={**tiny_job(dataset), "init_from": {"job": source["id"], "checkpoint": "x"}}
    )
    assert bad.status_code == 422 and "step-00000002, step-00000004" in bad.text
    path = client.post("/api/jobs", json={**tiny_job(dataset), "init_from": {"checkpoint": str(ckpt)}})
    assert path.status_code == 422 and "init_from" in path.text  # the API takes jobs, not paths
    job = client.post(
        "/api/jobs", json={**tiny_job(dataset), "init_from": {"job": source["id"], "checkpoint": "latest"}}
    ).json()
    refused = client.delete(f"/api/jobs/{source['id']}")  # the new job is queued or reading it
    assert refused.status_code == 409 and "init_from" in refused.json()["detail"]
    done = wait_status(client, job["id"], ("completed", "failed"))
    assert done["status"] == "completed", done
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before  # read, never written
    assert Path(done["output_dir"]) != Path(source["output_dir"])


def test_a_full_disk_at_export_loses_nothing_and_the_export_can_be_retried(
    client, dataset, settings, module_dir
):
    """The export's writes fail with ENOSPC (fault injection in the job process, tests/backend/faults): the job
    fails saying so, keeps a checkpoint of its last step and no final.tmp; with room again, POST .../export
    writes final/ from that checkpoint on the worker, and the download works."""
    from backend_support import WorkerProcess

    flag = module_dir / "disk-full"
    flag.write_text("")
    faults = Path(__file__).resolve().parent / "faults"
    env = {
        "PYTHONPATH": os.pathsep.join([str(faults), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "SLIDEDP_TEST_EXPORT_ENOSPC": str(flag),
    }
    worker = WorkerProcess(settings, module_dir / "worker-full.log", name="full-disk", extra_env=env).start()
    try:
        # Its own host, so that no other worker of this module takes the job; no checkpoint on the way.
        job = client.post("/api/jobs", json={**tiny_job(dataset), "host": "full-disk"}).json()
        failed = wait_status(client, job["id"], ("completed", "failed"))
        assert failed["status"] == "failed", failed
        message = failed["error"]["message"]
        assert "all 4 steps trained" in message and "No space left on device" in message, message
        assert f"POST /api/jobs/{job['id']}/export" in message
        assert failed["checkpoints"] == ["step-00000004"]
        out = Path(job["output_dir"])
        assert not (out / "final.tmp").exists() and not (out / "final").exists()
        assert client.get(f"/api/jobs/{job['id']}/export").status_code == 404

        still_full = client.post(f"/api/jobs/{job['id']}/export")
        assert still_full.status_code == 202
        again = wait_status(client, job["id"], ("completed", "failed"))
        assert again["status"] == "failed" and "No space left" in again["error"]["message"]
        assert again["checkpoints"] == ["step-00000004"] and not (out / "final.tmp").exists()

        flag.unlink()  # room again
        assert client.post(f"/api/jobs/{job['id']}/export").status_code == 202
        done = wait_status(client, job["id"], ("completed", "failed"))
        assert done["status"] == "completed", done
        resp = client.get(f"/api/jobs/{job['id']}/export")
        assert resp.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
        assert {"config.json", "model.safetensors"} <= names
        assert done["checkpoints"] == ["step-00000004"]
    finally:
        worker.stop()


def test_an_export_needs_an_ended_job_with_a_checkpoint_of_its_last_step(client, dataset, settings, worker):
    job = client.post(
        "/api/jobs", json={**tiny_job(dataset), "export": False, "host": settings.host_name}
    ).json()
    queued = client.post(f"/api/jobs/{job['id']}/export")
    assert queued.status_code in (409,) and "export it once it has ended" in queued.json()["detail"]
    assert wait_status(client, job["id"], ("completed", "failed"))["status"] == "completed"
    resp = client.post(f"/api/jobs/{job['id']}/export")
    assert resp.status_code == 409 and "no checkpoint" in resp.json()["detail"]
    assert client.post("/api/jobs/999999/export").status_code == 404


def test_a_database_from_before_owned_folders_upgrades_and_its_jobs_load(tmp_path, redis_server):
    """Rows written at migration 0001 gain the ownership columns empty (no token: a legacy job) and the action
    'train'; such a job is read, listed and deleted as before, losing only its outputs by name."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config
    from backend_support import make_settings
    from slidedp_web.core.db import MIGRATIONS_DIR, get_engine, read_session, upgrade
    from slidedp_web.jobs import delete
    from slidedp_web.models import JobRecord

    settings = make_settings(tmp_path / "old", redis_server.url)
    settings.data_dir.mkdir(parents=True)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", settings.sqlalchemy_url)
    command.upgrade(cfg, "0001")
    folder = settings.jobs_dir / "1"
    (folder / "checkpoints" / "step-00000002").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("{}\n")
    (folder / "mine.txt").write_text("a file the user put there")
    with get_engine(settings).begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, status, config, queue, created_at, step, steps, output_dir, attempt, "
                "event_seq, log_seq) VALUES (1, 'completed', :c, 'q', '2026-11-30 10:00:00', 4, 4, :o, 1, 0, 0)"
            ),
            {"c": json.dumps({"model": "tiny-qwen3", "output_dir": str(folder)}), "o": str(folder)},
        )
    upgrade(settings)
    with read_session(settings) as session:
        job = session.get(JobRecord, 1)
    assert (job.action, job.owner_token, job.outputs, job.init_from_job) == ("train", None, None, None)
    delete(settings, 1)
    assert os.listdir(folder) == ["mine.txt"]  # the outputs and the emptied checkpoints/ go; the folder stays
