"""The worker side of a generation: claim it, answer it in a freshly spawned process, record the answer.

The worker's task (tasks.run_generation) runs on the job's queue, one task at a time, so by the time it starts
no job trains on this host. The answer is computed in a spawned process, as a job is, because the worker's own
process never imports torch; that process reads the job's files again with the same checks the API made (a
file may have changed while the prompt waited), converts a named checkpoint once into the job's own folder
(`converted/step-N`, with slidedp.persist.export, reused while the checkpoint is unchanged), and loads the model
with slidedp.generate, prompts formatted in the job's data.format.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)


def supervise(settings: Any, generation_id: int) -> str:
    from slidedp_web.core.db import write_session
    from slidedp_web.models import Generation, JobRecord, utcnow

    with write_session(settings) as ws:
        gen = ws.get(Generation, generation_id, with_for_update=True)
        if gen is None or gen.status != "queued":
            return "ignored"  # dropped with its job, or a duplicate message
        # Locked as DELETE locks it (generations.refuse_delete_while_running): once this commits, the job's
        # files stay until the answer is recorded.
        job = ws.get(JobRecord, gen.job_id, with_for_update=True)
        gen.started_at, gen.host = utcnow(), settings.host_name
        if job is None:
            gen.status, gen.finished_at, gen.error = "failed", utcnow(), f"job {gen.job_id} was deleted"
            return "failed"
        gen.status = "running"
        ws.add(gen)
    log.info("generation %s of job %s: running", generation_id, gen.job_id)
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run, args=(settings.env(), generation_id, sender), name=f"slidedp-gen-{generation_id}")
    proc.start()
    sender.close()
    outcome: Optional[dict[str, Any]] = None
    while outcome is None and (proc.is_alive() or receiver.poll(0)):
        if receiver.poll(0.5):
            try:
                outcome = receiver.recv()
            except EOFError:
                break
    proc.join()
    receiver.close()
    if outcome is None:
        outcome = {"status": "failed", "error": f"the generation's process died (exit code {proc.exitcode}) before "
                   "answering; out of memory, most often"}
    return _finish(settings, generation_id, outcome)


def _finish(settings: Any, generation_id: int, outcome: dict[str, Any]) -> str:
    from slidedp_web.core.db import write_session
    from slidedp_web.journal import clean_json
    from slidedp_web.models import Generation, as_utc, utcnow

    with write_session(settings) as ws:
        gen = ws.get(Generation, generation_id, with_for_update=True)
        if gen is None:
            return "dropped"
        gen.finished_at = utcnow()
        gen.status = "done" if outcome.get("status") == "done" else "failed"
        gen.error = outcome.get("error")
        gen.formatted_prompt = outcome.get("formatted_prompt")
        gen.text = outcome.get("text")
        gen.result = clean_json(outcome.get("result"))
        timings = dict(outcome.get("timings") or {})
        timings["queued_s"] = (as_utc(gen.started_at) - as_utc(gen.created_at)).total_seconds()
        timings["total_s"] = (gen.finished_at - as_utc(gen.created_at)).total_seconds()
        gen.timings = clean_json({k: round(v, 4) if isinstance(v, float) else v for k, v in timings.items()})
        ws.add(gen)
    log.info("generation %s: %s", generation_id, gen.status)
    return gen.status


# --------------------------------------------------------------------------------- the spawned process
def run(env: dict[str, str], generation_id: int, conn: Any) -> None:
    os.environ.update(env)
    from slidedp_web.core.config import Settings

    settings = Settings()
    try:
        outcome = answer(settings, generation_id)
    except BaseException as exc:  # noqa: BLE001 - the outcome must reach the worker whatever happened
        outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    try:
        conn.send(outcome)
    except OSError:
        pass
    finally:
        conn.close()


def answer(settings: Any, generation_id: int) -> dict[str, Any]:
    from slidedp_web import generations
    from slidedp_web.core.db import read_session
    from slidedp_web.models import Generation, JobRecord

    with read_session(settings) as session:
        gen = session.get(Generation, generation_id)
        job = session.get(JobRecord, gen.job_id) if gen is not None else None
    if gen is None or job is None:
        return {"status": "failed", "error": "the generation or its job was deleted"}
    timings: dict[str, float] = {}
    try:
        source = generations.check_source(job, gen.checkpoint)
        _still_the_jobs(job)
        model_dir = source
        if gen.checkpoint:
            started = time.perf_counter()
            model_dir, converted = _converted(job, source)
            if converted:
                timings["convert_s"] = time.perf_counter() - started
    except generations.Unusable as exc:
        return {"status": "failed", "error": str(exc)}
    from slidedp.generate import GenerateError, Generator

    fmt = (job.config.get("data") or {}).get("format")
    try:
        gen_model = Generator(str(model_dir), fmt)
        timings["load_s"] = gen_model.load_s
        out = gen_model(gen.prompt, gen.max_new_tokens, gen.temperature, gen.seed)
    except GenerateError as exc:
        return {"status": "failed", "error": str(exc), "timings": timings}
    timings["generate_s"] = out.generate_s
    if out.generate_s > 0:
        timings["tokens_per_s"] = out.new_tokens / out.generate_s
    return {
        "status": "done",
        "formatted_prompt": out.formatted_prompt,
        "text": out.text,
        "timings": timings,
        "result": {"format": gen_model.format, "prompt_tokens": out.prompt_tokens, "new_tokens": out.new_tokens,
                   "stop": out.stop, "note": out.note, "device": gen_model.device, "model_dir": str(model_dir)},
    }


def _still_the_jobs(job: Any) -> None:
    """The folder still carries the job's owner marker (outputs.claim): nothing is read or written in a folder
    that has become another job's."""
    from slidedp_web import generations, outputs

    if job.owner_token is None:
        return  # recorded before folders were marked
    marker = outputs.read_marker(Path(job.output_dir))
    if not marker or marker.get("owner_token") != job.owner_token:
        raise generations.Unusable(f"job {job.id}'s folder {job.output_dir} is no longer marked as its own; "
                                   "nothing is read from it")


def _converted(job: Any, checkpoint: Path) -> tuple[Path, bool]:
    """The checkpoint as a Hugging Face directory in the job's folder, converted now unless an earlier conversion
    of this same checkpoint is there (a checkpoint rewritten under the same name, by a resumed run, is newer than
    its conversion). (directory, converted now)."""
    from slidedp.persist.export import ExportError, export_checkpoint

    from slidedp_web import generations

    folder = Path(job.output_dir)
    root = folder / generations.CONVERTED
    target = root / checkpoint.name
    if root.is_symlink() or (root.exists() and not root.is_dir()) or target.is_symlink():
        raise generations.Unusable(f"{root} is not a folder of the job's own; remove it and ask again")
    if target.is_dir() and (target / "config.json").is_file() and (
        target.stat().st_mtime >= (checkpoint / "meta.json").stat().st_mtime
    ):
        return target, False
    try:
        export_checkpoint(str(checkpoint), str(target))
    except ExportError as exc:
        raise generations.Unusable(f"converting {checkpoint.name} to a model directory failed: {exc}") from exc
    return target, True
