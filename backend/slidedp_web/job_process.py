"""The process one job runs in: spawned fresh by the worker for every attempt, it calls slidedp.train.

A fresh spawn (not fork) because CUDA state does not survive fork and each job must start clean. The process
leads its own process group so the worker can kill it together with the rank processes slidedp.train starts.
Per-step metrics and log lines go straight into the database (and onto Redis); the outcome goes back to the
supervising worker through a pipe.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any


def run(env: dict[str, str], job_id: int, attempt: int, stop: Any, conn: Any) -> None:
    os.setpgrp()
    os.environ.update(env)
    from slidedp_web.core.config import Settings

    settings = Settings()
    from slidedp_web import logs

    logs.configure("INFO", settings.log_format)
    try:
        outcome = _train(settings, job_id, attempt, stop)
    except BaseException as exc:  # noqa: BLE001 - the outcome must reach the worker whatever happened
        outcome = {"status": "failed", "error": {"message": f"{type(exc).__name__}: {exc}", "errors": []}}
        _log(settings, job_id, traceback.format_exc())
    finally:
        if _folder is not None:  # train() has ended the ranks and unmapped the host state by now
            _folder.release()
    if _orphan.gone.is_set():
        _finish_orphaned(settings, job_id, attempt, outcome)
        return
    try:
        conn.send(outcome)
    except OSError:  # the worker died after the watcher last looked: record the outcome here
        _finish_orphaned(settings, job_id, attempt, outcome)
    finally:
        conn.close()


def _finish_orphaned(settings: Any, job_id: int, attempt: int, outcome: dict[str, Any]) -> None:
    """No worker is left to record this attempt's outcome (it was killed): record it from here, as it would."""
    from slidedp_web.outcome import finish

    reason = "cancel" if _orphan.cancelled else "worker_gone"
    try:
        finish(settings, job_id, attempt, outcome, reason, False, 0)
    except Exception:  # noqa: BLE001 - then the heartbeat sweep marks it interrupted, as before
        _log(settings, job_id, traceback.format_exc())


def _log(settings: Any, job_id: int, text: str) -> None:
    from slidedp_web.journal import record_log
    from slidedp_web.logs import job_line

    for line in text.rstrip().splitlines() or [""]:
        job_line(job_id, line)
        try:
            record_log(settings, job_id, line)
        except Exception:  # noqa: BLE001 - a log line is not worth failing the job for
            pass


def has_checkpoint(output_dir: str) -> bool:
    path = os.path.join(output_dir, "checkpoints")
    return os.path.isdir(path) and any(not name.startswith(".") for name in os.listdir(path))


@dataclass
class _StoredJob:
    """What the job process reads of its job's record before it starts: the config with its output folder, what
    the attempt is for, the stored plan, and the name trackers give the run."""

    config: dict[str, Any]
    output_dir: str
    action: str  # "train" (train, or resume from the newest checkpoint) or "export"
    stored: Any  # the job's plan as stored (JobRecord.plan)
    run_name: str  # what W&B and MLflow call the run (config report_to)


def _train(settings: Any, job_id: int, attempt: int, stop: Any) -> dict[str, Any]:
    """One attempt, in the stages the job's log shows: read the job, its guards and folder claim, resume or start,
    slidedp.train (whose start-up stages follow "preparing"), and the outcome the worker records."""
    job = _read_job(settings, job_id)
    plan = stored_plan(job.stored)
    cfg, refused = _guards_and_folder_claim(settings, job_id, job, plan)
    if refused is not None:
        _log(settings, job_id, refused["message"])
        return {"status": "failed", "error": refused}
    if job.action == "export":
        return _export(settings, job_id, job.output_dir)
    cfg.resume = _resume_or_start(settings, job_id, attempt, cfg, job.output_dir)
    _watch_parent(settings, job_id, attempt, stop)
    if stop.value:  # cancelled while this process started: skip importing torch (seconds on a busy host)
        _log(settings, job_id, "stopped before the first step of this attempt")
        return {"status": "stopped", "steps_done": None}
    return _run_training(settings, job_id, cfg, plan, job, stop)


def _read_job(settings: Any, job_id: int) -> _StoredJob:
    from slidedp_web.core.db import read_session
    from slidedp_web.models import JobRecord

    with read_session(settings) as session:
        job = session.get(JobRecord, job_id)
        config = dict(job.config)
        config["output_dir"] = job.output_dir
        return _StoredJob(
            config=config,
            output_dir=job.output_dir,
            action=job.action or "train",
            stored=job.plan,
            run_name=job.name or f"job-{job_id}",
        )


def _guards_and_folder_claim(
    settings: Any, job_id: int, job: _StoredJob, plan: dict[str, Any] | None
) -> tuple[Any, dict[str, Any] | None]:
    """(the parsed config, None), or (…, the refusal that fails the job): the config parses, the job fits its host
    (preflight), the output folder is claimed and held, and an init_from checkpoint resolves; each check runs only
    when the one before passed, and all of them before anything is allocated or written."""
    from slidedp.config import ConfigError, JobConfig

    from slidedp_web.preflight import job_refusal, refusal

    try:
        cfg = JobConfig.from_dict(job.config)  # parsed once: the guards and slidedp.train take this object
    except ConfigError as exc:
        return None, refusal(settings, list(exc.errors))
    refused = job_refusal(settings, cfg, job_id, plan)  # before anything is allocated: a clear error, not an OOM kill
    if refused is None:
        refused = _claim_folder(settings, job_id)  # before anything is written
    if refused is None:
        refused = _hold_folder(settings, job_id, job.output_dir)  # one live process per folder, until this one ends
    if refused is None and cfg.init_from is not None:
        refused = _resolve_init_from(settings, cfg)
    return cfg, refused


def _resume_or_start(settings: Any, job_id: int, attempt: int, cfg: Any, output_dir: str) -> bool:
    """Whether this attempt resumes from the newest checkpoint (asked for, or a later attempt, and there is one),
    said in the job's log with where its output goes."""
    resume = cfg.resume or attempt > 1
    if resume and not has_checkpoint(output_dir):
        if attempt > 1:
            _log(
                settings,
                job_id,
                f"no checkpoint in {output_dir}/checkpoints yet: attempt {attempt} starts at step 0",
            )
        resume = False
    _log(
        settings,
        job_id,
        f"attempt {attempt} on {settings.host_name}: "
        + ("resuming from the newest checkpoint" if resume else "starting")
        + f"; output in {output_dir}",
    )
    return resume


def _run_training(
    settings: Any, job_id: int, cfg: Any, plan: dict[str, Any] | None, job: _StoredJob, stop: Any
) -> dict[str, Any]:
    """slidedp.train with the job's callbacks (metrics and log lines into the record, start-up stages, the stop
    flag), its outcome for the worker whether it trained, stopped or failed."""
    from slidedp.config import ConfigError

    from slidedp_web.journal import record_metrics, record_stage

    steps = [0]  # steps this attempt has finished

    def on_step(record: dict[str, Any]) -> None:
        steps[0] += 1
        record_metrics(settings, job_id, record)

    def should_stop() -> bool | str:
        # Before this attempt's first step the host state is still what it started from (its checkpoint, or the
        # initial weights): ending now loses nothing, while the ranks may be seconds from their first step
        # boundary (importing torch, joining the process group). train() cleans up as the exception passes.
        if stop.value and not steps[0]:
            raise _StoppedBeforeFirstStep
        return "save" if stop.value == 2 else bool(stop.value)

    record_stage(settings, job_id, {"stage": "preparing", "elapsed_s": 0.0})  # importing torch: seconds
    import slidedp
    from slidedp.launch import ExportFailed, UnhealthyRun

    try:
        result = slidedp.train(
            cfg,
            on_step=on_step,
            on_log=lambda line: _log(settings, job_id, line),
            should_stop=should_stop,
            plan=plan,
            on_stage=lambda stage: record_stage(settings, job_id, stage),
            run_name=job.run_name,
        )
    except _StoppedBeforeFirstStep:
        _log(settings, job_id, "stopped before the first step of this attempt")
        return {"status": "stopped", "steps_done": None}
    except ConfigError as exc:
        return {
            "status": "failed",
            "error": {"message": f"the job cannot start: {exc}", "errors": exc.errors},
        }
    except UnhealthyRun as exc:  # diverged, died, or a health warning with on_warning: stop
        _log(settings, job_id, str(exc))
        reason = "diverged" if str(exc).startswith("diverged:") else "health_stop"
        return {
            "status": "failed",
            "error": {
                "message": str(exc),
                "errors": [{"loc": "health", "msg": str(exc)}],
                "reason": reason,
                "step": exc.step,
            },
        }
    except ExportFailed as exc:  # trained to the end; the state is in a checkpoint when one could be kept
        _log(settings, job_id, f"ExportFailed: {exc}")
        retry = (
            f"; once there is room, POST /api/jobs/{job_id}/export writes the export from it"
            if exc.checkpoint
            else ""
        )
        return {
            "status": "failed",
            "error": {
                "message": f"{exc}{retry}",
                "errors": [{"loc": "output_dir", "msg": str(exc.export_error)}],
            },
        }
    except Exception as exc:  # noqa: BLE001 - TrainError carries the failing rank's traceback
        text = str(exc)
        _log(settings, job_id, f"{type(exc).__name__}: {text}")
        first = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
        return {"status": "failed", "error": {"message": f"{type(exc).__name__}: {first}", "errors": []}}
    return _trained_outcome(settings, job_id, result, job.stored)


def _trained_outcome(settings: Any, job_id: int, result: Any, stored: Any) -> dict[str, Any]:
    """The outcome of a run that returned: its status, steps, the files its export wrote (recorded as the job's),
    and the job's plan after it (under "policy", the key the worker's outcome.finish reads)."""
    if result.final_dir:
        _record_outputs(settings, job_id, export=list(getattr(result, "exported_files", None) or []))
    resolved = None
    if result.policy:
        # the job's plan after a run: the plan it was resolved from (the stored one, or the one made
        # again with "replanned" saying why), with the policy the ranks ran
        resolved = {**result.plan, "stage": "resolved", "policy": result.policy.to_dict()}
        if isinstance(stored, dict) and "replanned" in stored and "replanned" not in resolved:
            resolved["replanned"] = None  # the column is merged: an earlier run's reason is not this run's
        # how this run held up against the plan's prediction (None: too few steps, or no prediction); the column
        # is merged, so an earlier attempt's check is replaced either way
        resolved["prediction_check"] = getattr(result, "prediction_check", None)
    return {
        "status": result.status,
        "steps_done": result.steps_done,
        "policy": resolved,
        "final_dir": getattr(result, "final_dir", None),
        "checkpoint_dir": getattr(result, "checkpoint_dir", None),
    }


def _refusal(settings: Any, message: str, loc: str = "output_dir") -> dict[str, Any]:
    return {
        "message": f"refused before start on {settings.host_name}: {message}",
        "errors": [{"loc": loc, "msg": message}],
    }


def _claim_folder(settings: Any, job_id: int) -> dict[str, Any] | None:
    """Check the job's folder against every other job's recorded one, then claim it with the owner marker and
    record the folders that claim created (slidedp_web/outputs.py). None: the folder is the job's."""
    from pathlib import Path

    from slidedp_web import outputs
    from slidedp_web.core.db import write_session
    from slidedp_web.models import JobRecord

    with write_session(settings) as session:
        outputs.lock_jobs(session)
        job = session.get(JobRecord, job_id)
        folder = Path(job.output_dir)
        # Rows that overlap (written by an older workbench, or behind the API's back): the job recorded first
        # owns the folder; of jobs recorded later, the marker lets in only the first to claim it.
        owner = outputs.owner_of(
            outputs.real(folder), outputs.recorded_folders(session), job_id, older_only=True
        )
        if owner is not None:
            return _refusal(settings, outputs.conflict_message(outputs.real(folder), owner))
        legacy = job.owner_token is None
        token = job.owner_token or f"legacy-{job_id}"
        try:
            created = outputs.claim(folder, job_id, token, legacy=legacy)
        except outputs.FolderRefused as exc:
            return _refusal(settings, str(exc))
        except OSError as exc:
            return _refusal(settings, f"cannot write {str(folder)!r}: {exc.strerror or exc}")
        if legacy:
            job.owner_token = token
        before = dict(job.outputs or {})
        made = list(before.get("created_dirs") or []) + [
            d for d in created if d not in (before.get("created_dirs") or [])
        ]
        job.outputs = {**before, "claimed": True, "created_dirs": made}
        session.add(job)
    return None


# The job folder's lock (folder_lock.py), held from the claim until run() ends; released by the kernel if killed.
_folder: Any = None


def _hold_folder(settings: Any, job_id: int, output_dir: str) -> dict[str, Any] | None:
    """Take the folder's lock; an earlier attempt still holding it (its worker was killed and it is stopping at a
    step boundary) gets the cancel grace period and a little more to save and end, then its group is killed."""
    global _folder
    from slidedp_web import folder_lock

    try:
        _folder = folder_lock.take(
            output_dir, settings.cancel_grace_s + 10.0, lambda line: _log(settings, job_id, line)
        )
    except folder_lock.FolderBusy as exc:
        return _refusal(settings, str(exc))
    except OSError as exc:
        return _refusal(settings, f"cannot lock {str(output_dir)!r}: {exc.strerror or exc}")
    return None


def _resolve_init_from(settings: Any, cfg: Any) -> dict[str, Any] | None:
    """init_from {job, checkpoint NAME} becomes the checkpoint's path for the runtime, read-only there."""
    import dataclasses

    from slidedp_web.core.db import read_session
    from slidedp_web.jobs import checkpoint_path

    source = cfg.init_from
    if source.job is None:
        return None
    try:
        with read_session(settings) as session:
            path = checkpoint_path(session, int(source.job), str(source.checkpoint or "latest"))
    except FileNotFoundError as exc:
        return _refusal(settings, str(exc), "init_from")
    cfg.init_from = dataclasses.replace(source, job=None, checkpoint=path)
    return None


def stored_plan(stored: Any) -> dict[str, Any] | None:
    """The plan a job's record holds from its submission ("stage": "planned"), for the run to use when it
    was made on the host and calibration the run sees (slidedp.train's `plan`); None after a run has resolved it,
    or when no plan was kept."""
    if isinstance(stored, dict) and stored.get("stage") == "planned":
        return stored
    return None


def _record_outputs(settings: Any, job_id: int, **values: Any) -> None:
    from slidedp_web.core.db import write_session
    from slidedp_web.models import JobRecord

    with write_session(settings) as session:
        job = session.get(JobRecord, job_id)
        if job is not None:
            if "export" in values:  # each file's identity as written, which the download compares
                from pathlib import Path

                from slidedp_web.export_archive import stamped

                values["export"] = stamped(Path(job.output_dir) / "final", values["export"])
            job.outputs = {**(job.outputs or {}), **values}
            session.add(job)


def _export(settings: Any, job_id: int, output_dir: str) -> dict[str, Any]:
    """Write final/ from the newest checkpoint (POST /api/jobs/{id}/export)."""
    from slidedp.persist.export import export_checkpoint

    from slidedp_web.outputs import list_checkpoints

    found = list_checkpoints(output_dir)
    if not found:
        return {
            "status": "failed",
            "error": {"message": f"no checkpoint in {output_dir}/checkpoints to export", "errors": []},
        }
    _log(settings, job_id, f"exporting {found[-1].path} to {output_dir}/final")
    try:
        result = export_checkpoint(found[-1].path, os.path.join(output_dir, "final"))
    except Exception as exc:  # noqa: BLE001 - the export's own message says what it needs
        _log(settings, job_id, f"{type(exc).__name__}: {exc}")
        return {
            "status": "failed",
            "error": {
                "message": f"export failed: {exc}; every checkpoint is kept: free "
                "room, then POST /api/jobs/{id}/export again".replace("{id}", str(job_id)),
                "errors": [],
            },
        }
    files = list(result.get("files") or [])
    _record_outputs(settings, job_id, export=files)
    _log(settings, job_id, f"exported a Hugging Face model to {output_dir}/final ({len(files)} files)")
    return {
        "status": "completed",
        "steps_done": found[-1].step,
        "final_dir": os.path.join(output_dir, "final"),
    }


class _StoppedBeforeFirstStep(Exception):
    """A stop asked before the attempt's first step: raised through slidedp.train to end it at once."""


class _Orphan:
    """Set once the worker that started this process is gone; this process then reports for itself."""

    gone = threading.Event()
    cancelled = False


_orphan = _Orphan()


def _watch_parent(settings: Any, job_id: int, attempt: int, stop: Any) -> None:
    """If the worker dies, stop at the next step boundary with a checkpoint; kill the group if that hangs.

    Until then this process does the dead supervisor's part: it writes the heartbeat (the job is alive, and a
    sweep must not mark it interrupted and let a resume start beside it), passes a cancel request on, and
    records its own outcome (run())."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        _orphan.gone.set()
        stop.value = 2
        _log(settings, job_id, "the worker that ran this job is gone: stopping at the next step boundary")
        kill_at = time.monotonic() + settings.cancel_grace_s
        from slidedp_web.outcome import SAVE, STOP, heartbeat

        while time.monotonic() < kill_at:
            try:
                request = heartbeat(settings, job_id, attempt, write=True)
            except Exception:  # noqa: BLE001 - the database may be down; the stop goes on regardless
                request = None
            if request and not _orphan.cancelled:
                _orphan.cancelled = True
                stop.value = SAVE if request == "save" else STOP
            time.sleep(min(settings.heartbeat_s, 1.0))
        _log(settings, job_id, f"the job did not stop within {settings.cancel_grace_s:g} s: killing it")
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="slidedp-parent-watch", daemon=True).start()
