"""A job's output folder is its own.

Every job writes into one folder, recorded in its row (`jobs.output_dir`, resolved once at creation): by default
`<data>/jobs/<id>/`, or the `output_dir` the request names (a relative one under the first SLIDEDP_OUTPUT_ROOTS
folder, or under `<data>/jobs/named/` when none is set). The rules, from the request to the deletion:

* **One owner.** A folder is refused (409 naming `output_dir` and the owning job) when a job that is not deleted
  has recorded the same folder, one inside it or one containing it; when it is the data folder, contains it, or
  lies in the data folder anywhere but the job's own folder and below `<data>/jobs/named/` (the database, the
  API token file and the logs live there). The check runs in the write transaction that inserts
  the job (SQLite's BEGIN IMMEDIATE, a Postgres advisory lock), so two requests for one folder cannot both pass.
* **A marker in the folder.** Before the job process writes anything it checks the rows again and claims the
  folder with an owner marker (`.slidedp-job.json`, holding the job's id and its random owner token). A folder
  marked by another job, or holding files without a marker, is refused; the job's own retry finds its own marker.
  What the claim created (folders that did not exist) is recorded in the row.
* **DELETE removes what the job wrote**: the run's outputs by name (metrics.jsonl, checkpoints' step folders,
  final/ and its temporaries, converted/ with the checkpoints converted for generation), the marker, then the
  folders the job created, each only if empty. Never a parent, never a folder another job has recorded, never
  anything in a folder whose marker names another job.
* **The download serves what the export wrote**: the files the runtime listed when it exported (name and size,
  stored in the row), each a regular file of that size; anything else in final/ is not sent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from slidedp_web.models import CheckpointPublic

MARKER = ".slidedp-job.json"
# files a run writes in the folder: train()'s metrics, the job process's folder lock (slidedp_web/folder_lock.py) and
# the room kept for the last checkpoint (slidedp.persist.checkpoint.Reserve), which a killed run leaves behind
RUN_FILES = ("metrics.jsonl", "metrics.jsonl.tmp", ".slidedp-job.lock", ".slidedp-reserve")
RUN_DIRS = ("final", "final.tmp", "final.old")  # the export, its temporary and the one it replaces
# checkpoints converted to model directories for generation (slidedp_web/generations.py): the folder is the job's
CONVERTED_DIRS = ("converted",)
# what the experiment trackers write in the folder (slidedp.trackers, config report_to)
TRACKER_OUTPUTS = ("tensorboard", "wandb", "mlflow", "trackers.json", "trackers.json.tmp")
CHECKPOINTS = "checkpoints"
CHECKPOINT_ENTRY = re.compile(
    r"^(step-\d+|\.tmp-step-\d+-\d+|\.old-step-\d+-\d+)$"
)  # slidedp.persist.checkpoint
# What an export writes (slidedp.persist.export), for jobs exported before the file list was recorded.
EXPORT_NAME = re.compile(
    r"^(config\.json|generation_config\.json|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json"
    r"|(tokenizer|special_tokens_map|vocab|merges|chat_template|added_tokens)[\w.-]*)$"
)
NAMED_DIR = "named"  # the jobs root's folder of relative output folders (named_root); job ids are numbers
GIB = 2**30
SLACK_BYTES = 16 << 20  # meta.json, config and tokenizer files, directory entries


class FolderRefused(Exception):
    """The folder may not be used by this job; the message says why and what to do."""


def real(path: str | os.PathLike[str]) -> Path:
    """The absolute path with '~', '..' and symlinks resolved (what two paths are compared by)."""
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def output_roots(settings: Any) -> list[Path]:
    from slidedp_web.guards import parse_roots

    return parse_roots(settings.output_roots)


def named_root(settings: Any) -> Path:
    """Where relative output folders go when no output roots are set: a folder of the jobs root, beside the
    jobs' own folders (named by id, so never this one) and away from the database, token and logs."""
    return real(settings.jobs_dir) / NAMED_DIR


def resolve(settings: Any, value: str) -> Path:
    """Where a requested output_dir is: an absolute path as given; a relative one under the first output root,
    or under named_root when no roots are set (resolved, symlinks included)."""
    path = Path(os.path.expanduser(value))
    if not path.is_absolute():
        roots = output_roots(settings)
        path = (roots[0] if roots else named_root(settings)) / path
    return real(path)


def default_folder(settings: Any, job_id: int) -> Path:
    return real(settings.jobs_dir) / str(job_id)


def reserved_error(settings: Any, folder: Path, job_id: Optional[int]) -> Optional[str]:
    """Why the folder is the workbench's own (data folder, jobs root) rather than a job's, or None.

    In the data folder a job writes only its own folder (jobs/<id>) or a folder below named_root: anywhere else
    there it could take the place of the database, the API token file or the logs."""
    data, jobs_root, named = real(settings.data_dir), real(settings.jobs_dir), named_root(settings)
    own = default_folder(settings, job_id) if job_id is not None else None
    if folder == own or (folder != named and folder.is_relative_to(named)):
        return None
    if data.is_relative_to(folder):
        return (
            f"{str(folder)!r} is or contains the workbench's data folder {str(data)!r}, which holds its "
            "database and every job's folder; leave output_dir out to use the job's own folder"
        )
    if folder.is_relative_to(jobs_root):
        return (
            f"{str(folder)!r} is in {str(jobs_root)!r}, where each job gets its own folder by id; leave "
            f"output_dir out to use the job's own folder, or give a relative output_dir (it goes under "
            f"{str(named)!r})"
        )
    if folder.is_relative_to(data):
        return (
            f"{str(folder)!r} is in the workbench's data folder {str(data)!r}, beside its database, API token and "
            f"logs; leave output_dir out to use the job's own folder, or give a relative output_dir (it goes "
            f"under {str(named)!r})"
        )
    return None


def owner_of(
    folder: Path, others: Iterable[tuple[int, str]], job_id: Optional[int], older_only: bool = False
) -> Optional[tuple[int, str]]:
    """(id, recorded folder) of a job other than job_id whose folder is, contains or lies in `folder`; with
    `older_only`, of a job recorded before job_id (the first to record a folder owns it)."""
    for other_id, recorded in others:
        if other_id == job_id or not recorded or (older_only and job_id is not None and other_id > job_id):
            continue
        if overlaps(folder, real(recorded)):
            return other_id, recorded
    return None


def conflict_message(folder: Path, owner: tuple[int, str]) -> str:
    other_id, recorded = owner
    how = (
        "is"
        if real(recorded) == folder
        else ("lies in" if real(recorded).is_relative_to(folder) else "contains")
    )
    return (
        f"{str(folder)!r} belongs to job {other_id} (its folder {recorded!r} {how} it); every job writes its "
        "own folder: leave output_dir out, name another folder, or start from that job's weights with "
        f"init_from: {{job: {other_id}, checkpoint: latest}}"
    )


def conflict(loc: str, msg: str, job_id: Optional[int] = None) -> Any:
    """The API's 409: {"detail": [{"loc": ["body", ...], "msg", "type": "conflict", "job_id"?}]}."""
    from slidedp_web.errors import Conflict

    item: dict[str, Any] = {"loc": ["body", *loc.split(".")], "msg": msg, "type": "conflict"}
    if job_id is not None:
        item["job_id"] = job_id
    return Conflict([item])


def lock_jobs(session: Any) -> None:
    """Serialise the folder check with other inserts. SQLite's write_session already holds the database's write
    lock (BEGIN IMMEDIATE); Postgres takes a transaction-scoped advisory lock."""
    import sqlalchemy as sa

    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": 0x51D3D0}).all()


def recorded_folders(session: Any) -> list[tuple[int, str]]:
    import sqlalchemy as sa

    from slidedp_web.models import JobRecord

    return [(int(i), str(d)) for i, d in session.execute(sa.select(JobRecord.id, JobRecord.output_dir)).all()]


# ------------------------------------------------------------------------------------------ room to write
def needed_bytes(cfg: Any) -> int:
    """Disk a job writes at most: `checkpoint.keep` checkpoints plus the one being written (12 B/param each:
    fp32 master and AdamW moments), and the export (2 B/param in bf16, 4 in fp32)."""
    from slidedp.presets import model_config_dict, param_count

    params = param_count(model_config_dict(cfg.model))
    need = SLACK_BYTES
    if cfg.checkpoint.interval:
        need += (cfg.checkpoint.keep + 1) * 12 * params
    if cfg.export:
        need += (2 if cfg.precision == "bf16" else 4) * params
    return need


def nearest_existing(folder: Path) -> Path:
    """The folder itself or its nearest parent that can be looked up (os.path.exists never raises: a name too
    long, a loop of symlinks or a folder the server may not enter reads as missing, and the walk goes on up)."""
    probe = folder
    while not os.path.exists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def writable_error(folder: Path, need: Optional[int]) -> Optional[str]:
    """Why the job could not write its outputs into `folder` (made where missing), or None."""
    probe = nearest_existing(folder)
    if not os.path.isdir(probe):
        what = "is a file" if probe == folder else f"cannot be made: {str(probe)!r} is a file"
        return f"{str(folder)!r} {what}; name a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return (
            f"{str(folder)!r} is not writable by the workbench ({str(probe)!r} is read-only for it); name a "
            "folder it may write"
        )
    if need:
        try:
            free = shutil.disk_usage(probe).free
        except OSError:
            return None  # the space is not known here; the runtime checks it again before a checkpoint
        if free < need:
            return (
                f"the job writes up to {need / GIB:.2f} GiB (its checkpoints and export) but only "
                f"{free / GIB:.2f} GiB is free at {str(probe)!r}; free disk, name a folder on a larger disk, "
                "or lower checkpoint.keep"
            )
    return None


# ---------------------------------------------------------------------------------- claim by the worker
def read_marker(folder: Path) -> Optional[dict[str, Any]]:
    try:
        with open(folder / MARKER, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: someone's marker, not ours


def claim(folder: Path, job_id: int, token: str, legacy: bool = False) -> list[str]:
    """Make the folder the job's before it writes: create what is missing and write the owner marker.

    Returns the folders created (outermost first), which DELETE may remove again once empty. Raises
    FolderRefused when the folder is another job's (its marker) or holds files without a marker. `legacy`: a job
    recorded before markers existed, whose own earlier attempt may have left unmarked outputs.
    """
    if folder.exists() and not folder.is_dir():
        raise FolderRefused(f"{str(folder)!r} is a file, not a folder")
    created: list[str] = []
    if folder.is_dir():
        marker = read_marker(folder)
        if marker is not None:
            if marker.get("owner_token") != token:
                owner = marker.get("job_id", "another job")
                raise FolderRefused(
                    f"{str(folder)!r} is marked as the folder of job {owner} ({MARKER}); this job "
                    "writes only its own folder"
                )
            return []
        entries = [e for e in os.listdir(folder)]
        if entries and not legacy:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            raise FolderRefused(
                f"{str(folder)!r} already holds files this job did not write ({shown}); name an "
                "empty or new folder, or start from a job's weights with init_from"
            )
    else:
        missing = []
        probe = folder
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for path in reversed(missing):
            try:
                path.mkdir()
                created.append(str(path))
            except FileExistsError:
                if not path.is_dir():
                    raise FolderRefused(f"{str(path)!r} is a file, not a folder") from None
    tmp = folder / f"{MARKER}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"job_id": job_id, "owner_token": token}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MARKER)
    return created


# ------------------------------------------------------------------------------------------------ delete
def remove(
    folder: Path, token: Optional[str], outputs: Optional[dict[str, Any]], protected: Iterable[str]
) -> list[str]:
    """Remove what the job wrote in its folder (see the module doc); returns the paths removed.

    `protected`: folders other jobs have recorded; nothing that is, contains or lies in one of them is touched.
    """
    guard = [real(p) for p in protected if p]
    if not folder.is_dir() or folder.is_symlink():
        return []
    marker = read_marker(folder)
    if token is None:  # recorded before markers: its outputs are known by name, unless another job marked it
        if marker is not None:
            return []
    elif marker is None or marker.get("owner_token") != token:
        return []  # never claimed (deleted while queued), or another job's folder: nothing here is this job's
    removed: list[str] = []

    def drop(path: Path) -> None:
        if any(overlaps(real(path) if not path.is_symlink() else path, g) for g in guard):
            return
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            return
        removed.append(str(path))

    for name in RUN_FILES + RUN_DIRS + CONVERTED_DIRS + TRACKER_OUTPUTS:
        path = folder / name
        if path.exists() or path.is_symlink():
            drop(path)
    ckpts = folder / CHECKPOINTS
    if ckpts.is_dir() and not ckpts.is_symlink():
        for entry in sorted(os.listdir(ckpts)):
            if CHECKPOINT_ENTRY.match(entry):
                drop(ckpts / entry)
        _rmdir_if_empty(ckpts, removed, guard)
    elif ckpts.is_symlink():
        drop(ckpts)
    if marker is not None:
        (folder / MARKER).unlink(missing_ok=True)
        removed.append(str(folder / MARKER))
    created = list((outputs or {}).get("created_dirs") or [])
    for path in reversed(created):  # innermost first; each only when nothing else was put there
        _rmdir_if_empty(Path(path), removed, guard)
    return removed


def _rmdir_if_empty(path: Path, removed: list[str], guard: list[Path]) -> None:
    if any(g == real(path) or g.is_relative_to(real(path)) for g in guard):
        return
    try:
        path.rmdir()
        removed.append(str(path))
    except OSError:
        pass  # not empty, or gone already


# ------------------------------------------------------------------------------------------------ export
def export_listing(folder: Path, outputs: Optional[dict[str, Any]]) -> list[tuple[Path, int]]:
    """The files of the job's export to send: (path, size), each checked to be a regular file (not a link) of
    the size and identity (export_archive.stamped) the export recorded. Raises FileNotFoundError without an
    export, ValueError when final/ no longer holds what the job wrote."""
    final = folder / "final"
    if final.is_symlink() or not final.is_dir():
        raise FileNotFoundError(str(final))
    listed = (outputs or {}).get("export")
    if listed is None:
        # Exported before the file list was recorded: the names an export writes, nothing else.
        listed = [{"name": n, "bytes": None} for n in sorted(os.listdir(final)) if EXPORT_NAME.match(n)]
    files = []
    for item in listed:
        name = str(item.get("name", ""))
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"the recorded export lists an unusable name {name!r}")
        path = final / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise ValueError(f"{str(path)!r}, written by the export, is missing") from None
        import stat

        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{str(path)!r} is no longer the file the export wrote (not a regular file)")
        if item.get("bytes") is not None and st.st_size != int(item["bytes"]):
            raise ValueError(f"{str(path)!r} has {st.st_size} bytes, the export wrote {item['bytes']}")
        from slidedp_web.export_archive import changed

        if changed(st, item):
            raise ValueError(f"{str(path)!r} is no longer the file the export wrote (replaced or rewritten since)")
        files.append((path, st.st_size))
    if not files:
        raise FileNotFoundError(str(final))
    return files


def list_checkpoints(output_dir: str) -> list[CheckpointPublic]:
    """Complete checkpoints the runtime kept in output_dir/checkpoints, oldest first: step-N folders whose
    meta.json, written last, exists (a checkpoint still being written is a hidden temporary folder)."""
    root = Path(output_dir) / "checkpoints"
    if not output_dir or not root.is_dir():
        return []
    from slidedp_web.models import CheckpointPublic

    items = []
    for entry in root.iterdir():
        m = re.fullmatch(r"step-(\d+)", entry.name)
        if m is None or entry.is_symlink() or not (entry / "meta.json").is_file():
            continue
        size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file() and not p.is_symlink())
        items.append(CheckpointPublic(name=entry.name, step=int(m.group(1)), bytes=size, path=str(entry)))
    return sorted(items, key=lambda c: (c.step or 0, c.name))
