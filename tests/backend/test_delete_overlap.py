"""DELETE never touches another job's folder, even one inside the deleted job's run outputs.

Rows written before folders were owned may record any folder, also one in another job's `final/` or
`checkpoints/`. outputs.remove() is judged directly on folders laid out as a run leaves them (marker, metrics,
checkpoint step folders, final/), and once through the real API, worker and database: the job's own outputs go,
whatever another job recorded stays file for file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from slidedp_web import outputs

TOKEN = "owner-token-of-a"


def run_folder(root: Path, job_id: int = 1, token: str = TOKEN) -> Path:
    """A folder as a finished run leaves it: claimed (marker), metrics, two checkpoints, an export."""
    folder = root / "a"
    created = outputs.claim(folder, job_id, token)
    assert created == [str(folder)]
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    for step in (2, 4):
        ckpt = folder / "checkpoints" / f"step-{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "master.safetensors").write_bytes(b"m" * 16)
    (folder / "final").mkdir()
    (folder / "final" / "model.safetensors").write_bytes(b"w" * 32)
    (folder / "final" / "config.json").write_text("{}")
    return folder


def tree(path: Path) -> dict[str, bytes | None]:
    """Every path under `path` (relative) with a file's bytes, None for a folder."""
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))
    }


def remove(folder: Path, protected: list[Path], token: str | None = TOKEN) -> list[str]:
    return outputs.remove(folder, token, {"created_dirs": [str(folder)]}, [str(p) for p in protected])


def test_without_other_jobs_delete_removes_the_run_and_the_folder_it_created(tmp_path):
    folder = run_folder(tmp_path)
    removed = remove(folder, [])
    assert not folder.exists()
    assert {Path(p).name for p in removed} >= {
        "metrics.jsonl", "step-00000002", "step-00000004", "checkpoints", "final", outputs.MARKER, "a",
    }


def test_a_killed_run_s_lock_and_reserved_room_go_with_its_folder(tmp_path):
    """A run killed with -9 leaves its folder lock and the room reserved for its last checkpoint: DELETE removes
    them as the run's own files, so the folder it created goes too."""
    from slidedp.persist.checkpoint import Reserve
    from slidedp_web.folder_lock import LOCK_NAME

    folder = run_folder(tmp_path)
    (folder / LOCK_NAME).write_text("4242 host boot\n")
    (folder / Reserve.NAME).write_bytes(b"\0" * 4096)
    removed = remove(folder, [])
    assert not folder.exists(), tree(folder)
    assert {LOCK_NAME, Reserve.NAME} <= {Path(p).name for p in removed}


@pytest.mark.parametrize(
    "other",
    [
        "final",  # another job recorded the export folder itself
        "final/nested",  # ... a folder inside it
        "checkpoints/step-00000002",  # ... a checkpoint's step folder
        "checkpoints/step-00000002/inner",  # ... a folder inside a checkpoint
    ],
)
def test_a_run_folder_that_is_or_contains_another_job_s_folder_is_kept_whole(tmp_path, other):
    folder = run_folder(tmp_path)
    theirs = folder / other
    theirs.mkdir(exist_ok=True)
    (theirs / "their-notes.txt").write_text("job b")
    # the run output that is or holds the other job's folder: final/, or the checkpoint's step folder
    top = folder / ("checkpoints/step-00000002" if other.startswith("checkpoints") else "final")
    kept = tree(top)

    removed = remove(folder, [theirs])

    assert tree(top) == kept  # the run output holding the other job's folder: not one file less
    assert (theirs / "their-notes.txt").read_text() == "job b"
    assert not (folder / "metrics.jsonl").exists() and not (folder / outputs.MARKER).exists()
    assert str(folder / "metrics.jsonl") in removed
    if other.startswith("checkpoints"):
        # the other checkpoint is the job's own and goes; the checkpoints folder stays (not empty)
        assert not (folder / "checkpoints" / "step-00000004").exists()
        assert not (folder / "final").exists()
    else:
        assert not (folder / "checkpoints").exists()  # both step folders were the job's, then the empty folder
    assert folder.is_dir()  # it holds another job's folder: never removed
    assert str(folder) not in removed


def test_the_checkpoints_folder_recorded_by_another_job_is_kept_with_every_step(tmp_path):
    folder = run_folder(tmp_path)
    kept = tree(folder / "checkpoints")
    remove(folder, [folder / "checkpoints"])
    assert tree(folder / "checkpoints") == kept
    assert not (folder / "final").exists() and not (folder / "metrics.jsonl").exists()


def test_a_run_folder_inside_another_job_s_folder_is_left_alone(tmp_path):
    """Another job recorded a folder containing this one (a legacy row on the parent): the run's outputs and the
    folder lie in that job's folder and stay. Only the deleted job's own marker goes (remove() drops it without
    the guard), so the folder no longer names a job that is gone."""
    folder = run_folder(tmp_path)
    kept = tree(tmp_path)
    assert remove(folder, [tmp_path]) == [str(folder / outputs.MARKER)]
    assert tree(tmp_path) == {k: v for k, v in kept.items() if k != f"a/{outputs.MARKER}"}


def test_a_created_folder_holding_a_folder_another_job_recorded_stays_even_when_empty(tmp_path):
    """The job created parent/ and parent/a; another job recorded parent/b, not made yet (it is queued): once
    the run outputs are gone, parent/a is removed but parent/ is not, though it is empty."""
    parent = tmp_path / "parent"
    folder = parent / "a"
    created = outputs.claim(folder, 1, TOKEN)
    assert created == [str(parent), str(folder)]
    (folder / "metrics.jsonl").write_text("{}\n")
    removed = outputs.remove(folder, TOKEN, {"created_dirs": created}, [str(parent / "b")])
    assert not folder.exists() and str(folder) in removed
    assert parent.is_dir() and os.listdir(parent) == [] and str(parent) not in removed


def test_a_link_to_another_job_s_folder_is_unlinked_and_its_target_kept(tmp_path):
    """final/ replaced by a link to another job's folder: the link is this job's entry and goes; what it points
    to is the other job's and stays."""
    folder = run_folder(tmp_path)
    theirs = tmp_path / "b"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"b" * 8)
    for p in sorted((folder / "final").iterdir()):
        p.unlink()
    (folder / "final").rmdir()
    (folder / "final").symlink_to(theirs, target_is_directory=True)
    removed = remove(folder, [theirs])
    assert str(folder / "final") in removed and not os.path.lexists(folder / "final")
    assert (theirs / "model.safetensors").read_bytes() == b"b" * 8


def test_a_folder_marked_by_another_job_or_never_claimed_is_not_touched(tmp_path):
    folder = run_folder(tmp_path)
    kept = tree(folder)
    assert remove(folder, [], token="someone-else") == []  # the marker names another job
    assert remove(folder, [], token=None) == []  # a row from before markers, on a folder a job has marked
    assert tree(folder) == kept
    (folder / outputs.MARKER).unlink()
    assert remove(folder, [], token=TOKEN) == []  # deleted while queued: the folder was never claimed
    assert tree(folder) == {k: v for k, v in kept.items() if k != outputs.MARKER}


def test_a_row_from_before_markers_removes_its_outputs_by_name_only(tmp_path):
    folder = run_folder(tmp_path)
    (folder / outputs.MARKER).unlink()
    (folder / "user-notes.txt").write_text("keep me")
    (folder / "checkpoints" / "mine").mkdir()
    removed = remove(folder, [], token=None)
    assert sorted(os.listdir(folder)) == ["checkpoints", "user-notes.txt"]
    assert os.listdir(folder / "checkpoints") == ["mine"]  # not a checkpoint's name: not the job's
    assert str(folder / "checkpoints" / "step-00000002") in removed


# ------------------------------------------------------------------------------- through the real API
def insert_legacy_job(settings, output_dir: str) -> int:
    """A row as the workbench wrote it before folders were owned (no owner token, nothing recorded)."""
    from slidedp_web.core.db import write_session
    from slidedp_web.models import JobRecord, utcnow

    with write_session(settings) as ws:
        job = JobRecord(status="completed", config={"model": "tiny-qwen3", "output_dir": output_dir},
                  queue=settings.queue, created_at=utcnow(), steps=4, output_dir=output_dir)
        ws.add(job)
        ws.flush()
        return int(job.id)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_delete_keeps_the_export_and_checkpoint_other_rows_recorded(client, dataset, settings, worker):
    from backend_support import tiny_job, wait_status

    job = client.post("/api/jobs", json={**tiny_job(dataset), "checkpoint": {"interval": 2, "keep": 2}}).json()
    assert wait_status(client, job["id"], ("completed", "failed"))["status"] == "completed"
    folder = Path(job["output_dir"])
    assert sorted(os.listdir(folder / "checkpoints")) == ["step-00000002", "step-00000004"]
    # rows from before folders were owned: one recorded the job's export folder, one a folder inside a checkpoint
    insert_legacy_job(settings, str(folder / "final"))
    insert_legacy_job(settings, str(folder / "checkpoints" / "step-00000002" / "theirs"))
    final, step2 = tree(folder / "final"), tree(folder / "checkpoints" / "step-00000002")
    assert "model.safetensors" in final and step2

    assert client.delete(f"/api/jobs/{job['id']}").status_code == 204

    assert tree(folder / "final") == final and tree(folder / "checkpoints" / "step-00000002") == step2
    assert os.listdir(folder / "checkpoints") == ["step-00000002"]  # its own last checkpoint went
    assert not (folder / "metrics.jsonl").exists() and not (folder / outputs.MARKER).exists()
    assert client.get(f"/api/jobs/{job['id']}").status_code == 404


def test_claim_and_remove_at_their_edges(tmp_path):
    """What mutation testing found untested: an existing empty folder is claimed, one holding unmarked files is
    refused, the marker names its job (and a second job's claim says whose it is), a marker that is not an object
    owns nothing for anyone, and a link to a run folder is no run folder."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert outputs.claim(empty, 7, TOKEN) == []
    assert outputs.read_marker(empty) == {"job_id": 7, "owner_token": TOKEN}
    with pytest.raises(outputs.FolderRefused, match="marked as the folder of job 7"):
        outputs.claim(empty, 8, "another-token")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(outputs.FolderRefused):
        outputs.claim(busy, 9, TOKEN)
    assert (busy / "notes.txt").read_text() == "mine" and not (busy / outputs.MARKER).exists()

    listed = run_folder(tmp_path)
    (listed / outputs.MARKER).write_text("[1, 2]")
    assert outputs.read_marker(listed) == {}
    assert remove(listed, []) == [] and (listed / "metrics.jsonl").exists()

    target = tmp_path / "target"
    outputs.claim(target, 1, TOKEN)
    (target / "metrics.jsonl").write_text("{}\n")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    assert remove(link, []) == [] and (target / "metrics.jsonl").exists()


def test_a_claim_says_whose_folder_it_is_and_what_is_in_it(tmp_path):
    """A job's own retry finds its own marker and goes on; another job is told the folder's path and owner (or
    that another job owns it, when the marker names none), and a folder of unmarked files is named with at most
    five of its entries."""
    own = tmp_path / "own"
    assert outputs.claim(own, 3, TOKEN) == [str(own)]
    assert outputs.claim(own, 3, TOKEN) == []  # the retry
    with pytest.raises(outputs.FolderRefused) as err:
        outputs.claim(own, 4, "another-token")
    assert str(err.value) == (f"{str(own)!r} is marked as the folder of job 3 ({outputs.MARKER}); this job writes "
                              "only its own folder")
    (own / outputs.MARKER).write_text('{"owner_token": "t"}')
    with pytest.raises(outputs.FolderRefused, match="is marked as the folder of job another job"):
        outputs.claim(own, 4, "another-token")
    full = tmp_path / "full"
    full.mkdir()
    for name in "abcdef":
        (full / f"{name}.txt").write_text(name)
    with pytest.raises(outputs.FolderRefused) as err:
        outputs.claim(full, 5, TOKEN)
    assert str(err.value) == (
        f"{str(full)!r} already holds files this job did not write (a.txt, b.txt, c.txt, d.txt, e.txt, ...); name "
        "an empty or new folder, or start from a job's weights with init_from")
    (full / "f.txt").unlink()
    with pytest.raises(outputs.FolderRefused, match=r"\(a\.txt, b\.txt, c\.txt, d\.txt, e\.txt\); name"):
        outputs.claim(full, 5, TOKEN)
