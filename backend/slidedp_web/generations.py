"""Trying a job's trained model from the API: a prompt is checked, recorded and sent to the job's queue, and its
answer is read back by polling.

    POST /api/jobs/{id}/generate {prompt, max_new_tokens?, temperature?, seed?, checkpoint?}  -> 202 + poll link
    GET  /api/jobs/{id}/generations/{gid}                 -> status, formatted prompt, answer, timings

A generation runs where the job's files are: on the job's host, as one task of its queue (the worker there runs
one task at a time), so it waits behind a job that trains there and never takes GPU or host memory from one. The
worker side (claim, convert a checkpoint, load, answer) is generation_process.py.

What a request may touch is its own job's folder, and only by name: the export the job wrote (final/, each file
as the export listed it), or a checkpoint named `step-N` that lies in the job's own `checkpoints/` folder (not
through a symlink) and is complete. A converted checkpoint is written into the job's folder (`converted/step-N`),
which DELETE removes with the rest of the job's outputs; deleting a job drops its queued generations and waits
for a running one (409), in the same transaction a worker's claim takes, so no generation reads or writes a
folder that is being removed.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Session, func, select

from slidedp_web import celery_app, live, outputs
from slidedp_web.core.config import Settings
from slidedp_web.core.db import write_session
from slidedp_web.errors import Conflict, NotFound, TooMany, refused
from slidedp_web.job_schema import text_errors, unprocessable
from slidedp_web.models import (
    Generation,
    GenerationPublic,
    Host,
    JobRecord,
    StatusChange,
    as_utc,
    iso,
    utcnow,
)

CHECKPOINT_NAME = re.compile(r"step-\d{1,19}")  # slidedp.persist.checkpoint names them step-NNNNNNNN
CONVERTED = "converted"  # <output_dir>/converted/step-N: a checkpoint as a Hugging Face directory
MAX_PROMPT_CHARS = 20_000
MAX_NEW_TOKENS = 1024
MAX_TEMPERATURE = 5.0
SEED_MAX = 2**31 - 1
MAX_QUEUED_PER_JOB = 20
KEYS = ("prompt", "max_new_tokens", "temperature", "seed", "checkpoint")


# ---------------------------------------------------------------------------------------------- request
def parse_request(body: Any) -> dict[str, Any]:
    """The request's settings with defaults filled in; every problem in one 422."""
    if not isinstance(body, dict):
        raise unprocessable([{"loc": "", "msg": "must be a JSON object {prompt, max_new_tokens?, temperature?, "
                              f"seed?, checkpoint?}}, got {type(body).__name__}"}])
    errors = text_errors(body, "")
    if errors:
        raise unprocessable(errors)
    errors = [{"loc": k, "msg": f"unknown key; allowed: {', '.join(KEYS)}"} for k in body if k not in KEYS]
    out: dict[str, Any] = {"max_new_tokens": 64, "temperature": 0.0, "seed": 0, "checkpoint": None}
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        errors.append({"loc": "prompt", "msg": f"must be text, got {prompt!r}"})
    elif not prompt or not prompt.strip():
        errors.append({"loc": "prompt", "msg": "is required: the text for the model to answer, not blank"})
    elif len(prompt) > MAX_PROMPT_CHARS:
        errors.append({"loc": "prompt", "msg": f"must be at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}"})
    else:
        out["prompt"] = prompt

    def integer(key: str, lo: int, hi: int, what: str) -> None:
        value = body.get(key, out[key])
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            errors.append({"loc": key, "msg": f"must be an integer from {lo} to {hi} ({what}), got {value!r}"})
        else:
            out[key] = value

    integer("max_new_tokens", 1, MAX_NEW_TOKENS, "tokens to generate at most")
    integer("seed", 0, SEED_MAX, "seed of the sampling")
    temp = body.get("temperature", 0.0)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not math.isfinite(temp) or not (
        0 <= temp <= MAX_TEMPERATURE
    ):
        errors.append({"loc": "temperature", "msg": f"must be a number from 0 (greedy) to {MAX_TEMPERATURE:g}, "
                       f"got {temp!r}"})
    else:
        out["temperature"] = float(temp)
    name = body.get("checkpoint")
    if name is not None and (not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name)):
        errors.append({"loc": "checkpoint", "msg": "must be the name of one of the job's checkpoints, such as "
                       "step-00000020 (GET /api/jobs/{id}/checkpoints lists them), or null for the job's export; "
                       "paths are not accepted"})
    else:
        out["checkpoint"] = name
    if errors:
        raise unprocessable(errors)
    return out


# ------------------------------------------------------------------------------------------ what to load
class Unusable(Exception):
    """The job's model cannot be loaded as asked; `status` is the HTTP answer (409, 422) and the message says
    what to do."""

    def __init__(self, message: str, status: int = 409, loc: Optional[str] = None):
        super().__init__(message)
        self.status, self.loc = status, loc


def export_dir(job: JobRecord) -> Path:
    """The job's export (final/), when it holds every file the export listed, as it wrote them."""
    folder = Path(job.output_dir)
    try:
        files = outputs.export_listing(folder, job.outputs)
    except FileNotFoundError:
        raise Unusable(
            f"job {job.id} has no export: it is written when a job completes with export: true. Name one of its "
            f"checkpoints instead (GET /api/jobs/{job.id}/checkpoints), or write the export with POST "
            f"/api/jobs/{job.id}/export"
        ) from None
    except ValueError as exc:
        raise Unusable(f"job {job.id}'s export cannot be used: {exc}; POST /api/jobs/{job.id}/export writes it "
                       "again from a checkpoint of its last step") from None
    if not any(p.name.startswith("tokenizer") for p, _ in files):
        raise Unusable(f"job {job.id}'s export holds no tokenizer ({job.config.get('model')!r} comes without one), "
                       "and prompts are text: generation needs a model with a tokenizer")
    return folder / "final"


def checkpoint_dir(job: JobRecord, name: str) -> Path:
    """The job's own checkpoint `name`: in its folder's checkpoints/ (neither of them a symlink, nothing leading
    elsewhere), complete (meta.json and master.f32 regular files). Raises Unusable (422 at `checkpoint`)."""
    from slidedp.data.tokenizer import tokenizer_source

    folder = Path(job.output_dir)
    root = folder / "checkpoints"
    path = root / name
    inside = (
        CHECKPOINT_NAME.fullmatch(name) is not None
        and not folder.is_symlink()
        and not root.is_symlink()
        and not path.is_symlink()
        and path.is_dir()
        and outputs.real(path).parent == outputs.real(folder) / "checkpoints"
        and all(_regular(path / f) for f in ("meta.json", "master.f32"))
    )
    if not inside:
        names = [c.name for c in outputs.list_checkpoints(job.output_dir)]
        has = f"it has: {', '.join(names)}" if names else "it has none (it keeps them with checkpoint.interval > 0)"
        raise Unusable(f"job {job.id} has no checkpoint {name!r} in its folder; {has} (GET "
                       f"/api/jobs/{job.id}/checkpoints)", 422, "checkpoint")
    model = str(job.config.get("model", ""))
    if tokenizer_source(model) is None:
        raise Unusable(f"job {job.id}'s model {model!r} has no tokenizer, and prompts are text: generation needs "
                       "a model with a tokenizer")
    return path


def _regular(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def check_source(job: JobRecord, checkpoint: Optional[str]) -> Path:
    return checkpoint_dir(job, checkpoint) if checkpoint else export_dir(job)


# The count below encodes the prompt as the job's format renders it, without the special tokens the worker's
# tokenizer may add (a BOS, a chat template's headers): a lower bound of what the model reads. The margin covers
# a tokenizer that transformers loads a little differently from its tokenizer.json (a prefix space), so that
# only a prompt the worker would certainly refuse is refused here; one just past the limit is the worker's to say.
CONTEXT_MARGIN = 4


def context_error(job: JobRecord, source: Path, request: dict[str, Any]) -> Optional[str]:
    """Why the prompt and max_new_tokens do not fit the model's context (max_position_embeddings), as the worker
    would find it after waiting in the queue; None when they fit, or when this process cannot count the tokens
    (no tokenizer.json, no `tokenizers` package: the worker's own check then says it)."""
    model = str(job.config.get("model", ""))
    fmt = (job.config.get("data") or {}).get("format") or "text"
    limit = _max_positions(source / "config.json" if not request["checkpoint"] else None, model)
    tokenizer = _tokenizer(source if not request["checkpoint"] else None, model)
    if not isinstance(limit, int) or limit <= 0 or tokenizer is None:
        return None
    from slidedp.data.formats import prompt_text

    prompt = request["prompt"]
    text = prompt_text({"instruction": prompt, "prompt": prompt}, fmt) if fmt in ("prompt_completion", "alpaca") \
        else prompt
    tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)
    asked = request["max_new_tokens"]
    if tokens - CONTEXT_MARGIN + asked <= limit:
        return None
    room = limit - asked
    shorten = f"shorten the prompt to at most about {room} tokens, or " if room > 0 else ""
    return (f"is at least {tokens} tokens as the job's data.format {fmt} renders it, and with max_new_tokens {asked} "
            f"that is more than the {limit} positions the model takes (max_position_embeddings); {shorten}ask for "
            "fewer new tokens")


def _max_positions(config_json: Optional[Path], model: str) -> Any:
    """max_position_embeddings of the export's config.json, or (config_json None: a checkpoint) of the job's
    model: its preset or its directory's config.json."""
    import json

    from slidedp.config import is_model_path
    from slidedp.presets import PRESETS

    if config_json is None:
        if not is_model_path(model):
            return (PRESETS.get(model) or {}).get("max_position_embeddings")
        config_json = Path(model) / "config.json"
    try:
        return json.loads(config_json.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None


def _tokenizer(export: Optional[Path], model: str) -> Any:
    """The tokenizer the worker would load, from its tokenizer.json (the export's, or the job's model's)."""
    from slidedp.data.tokenizer import tokenizer_source

    folder = export if export is not None else tokenizer_source(model)
    path = Path(folder) / "tokenizer.json" if folder else None
    try:
        st = path.stat() if path else None
    except OSError:
        return None
    return _load_tokenizer(str(path), st.st_mtime_ns, st.st_size) if st else None


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str, _mtime_ns: int, _size: int) -> Any:
    try:
        from tokenizers import Tokenizer  # the Rust tokenizer alone: no torch, no transformers in the API
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(path)
    except Exception:  # noqa: BLE001 - a tokenizer this library cannot read is the worker's to load or refuse
        return None


# ----------------------------------------------------------------------------------------------- create
def create(settings: Settings, session: Session, job_id: int, body: Any) -> Generation:
    request = parse_request(body)  # a bad body is a 422 whether or not the job exists
    job = session.get(JobRecord, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    try:
        source = check_source(job, request["checkpoint"])
    except Unusable as exc:
        if exc.loc:
            raise unprocessable([{"loc": exc.loc, "msg": str(exc)}]) from None
        raise refused(exc.status, str(exc)) from None
    too_long = context_error(job, source, request)
    if too_long:
        raise unprocessable([{"loc": "prompt", "msg": too_long}])
    live.require(settings, "generation")
    queued = session.exec(
        select(func.count()).select_from(Generation).where(Generation.job_id == job_id, Generation.status == "queued")
    ).one()
    if queued >= MAX_QUEUED_PER_JOB:
        raise TooMany(f"job {job_id} already has {queued} prompts waiting; poll them "
                            f"(GET /api/jobs/{job_id}/generations/ID) and ask again once they are answered")
    with write_session(settings) as ws:
        # The job row is locked as DELETE locks it: a job deleted meanwhile is not given a new generation.
        if ws.get(JobRecord, job_id, with_for_update=True) is None:
            raise NotFound(f"job {job_id} does not exist")
        gen = Generation(job_id=job_id, status="queued", queue=job.queue, created_at=utcnow(), **request)
        ws.add(gen)
    try:
        celery_app.enqueue_generation(settings, gen.id, gen.queue)
    except Exception as exc:  # noqa: BLE001 - the broker went away between the check and the send
        with write_session(settings) as ws:
            ws.execute(sa.delete(Generation).where(Generation.id == gen.id))
        raise live.unavailable(settings, "generation") from exc
    return gen


def get_or_404(session: Session, job_id: int, generation_id: int) -> Generation:
    gen = session.get(Generation, generation_id)
    if gen is None or gen.job_id != job_id:  # another job's generation is not reachable through this one
        raise NotFound(f"job {job_id} has no generation {generation_id}")
    return gen


# ------------------------------------------------------------------------------------------ public view
def url(gen: Generation) -> str:
    return f"/api/jobs/{gen.job_id}/generations/{gen.id}"


def public(session: Session, gen: Generation) -> GenerationPublic:
    result = gen.result or {}
    waiting, behind = waiting_for(session, gen) if gen.status == "queued" else (None, None)
    timings = dict(gen.timings or {})
    if gen.status == "queued":
        timings["queued_s"] = round((utcnow() - as_utc(gen.created_at)).total_seconds(), 3)
    return GenerationPublic(
        id=gen.id, job_id=gen.job_id, status=gen.status, url=url(gen), prompt=gen.prompt,
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, seed=gen.seed, checkpoint=gen.checkpoint,
        host=gen.host, waiting=waiting, waiting_for_job=behind, formatted_prompt=gen.formatted_prompt,
        text=gen.text, format=result.get("format"), prompt_tokens=result.get("prompt_tokens"),
        new_tokens=result.get("new_tokens"), stop=result.get("stop"), note=result.get("note"), error=gen.error,
        created_at=iso(gen.created_at), started_at=iso(gen.started_at), finished_at=iso(gen.finished_at),
        timings=timings,
    )


def waiting_for(session: Session, gen: Generation) -> tuple[str, Optional[int]]:
    """What a queued generation waits for on its queue, in words, and the id of the running job it waits behind
    (None when it waits for something else)."""
    host = session.exec(select(Host).where(Host.queue == gen.queue)).first()
    where = f"host {host.name}" if host else f"queue {gen.queue}"
    # A job's place in the queue is when it was last queued (created, resumed, or asked to export).
    queued_at = (
        select(StatusChange.job_id, func.max(StatusChange.ts).label("ts"))
        .where(StatusChange.status == "queued")
        .group_by(StatusChange.job_id)
        .subquery()
    )
    earlier = (
        session.exec(
            select(func.count()).select_from(Generation).where(
                Generation.queue == gen.queue, Generation.status == "queued", Generation.id < gen.id
            )
        ).one()
        + session.exec(
            select(func.count()).select_from(JobRecord).join(queued_at, queued_at.c.job_id == JobRecord.id).where(
                JobRecord.queue == gen.queue, JobRecord.status == "queued", queued_at.c.ts < gen.created_at
            )
        ).one()
    )
    then = f", then {earlier} queued before it" if earlier else ""
    running = session.exec(select(JobRecord).where(JobRecord.queue == gen.queue, JobRecord.status == "running")).first()
    if running is not None:
        return f"waiting for the running job {running.id} on host {running.host or where}{then}", running.id
    busy = session.exec(
        select(Generation).where(Generation.queue == gen.queue, Generation.status == "running")
    ).first()
    if busy is not None:
        return f"waiting for generation {busy.id} of job {busy.job_id} on {where}{then}", None
    if earlier:
        return f"waiting for {earlier} queued before it on {where}", None
    return f"waiting for the worker of {where} to take it", None


# ----------------------------------------------------------------------------------------------- delete
def refuse_delete_while_running(ws: Session, job_id: int) -> None:
    """In DELETE's write transaction (the job row locked, as a worker's claim locks it): a generation that is
    reading or converting the job's files holds the deletion off; queued ones are dropped with the job's rows."""
    ws.get(JobRecord, job_id, with_for_update=True)
    busy = ws.exec(
        select(Generation.id).where(Generation.job_id == job_id, Generation.status == "running")
    ).first()
    if busy is not None:
        raise Conflict(f"job {job_id}'s model is answering a prompt (generation {busy}); delete the job "
                            "once it is done (seconds, usually)")


def fail_leftovers(settings: Settings, host_name: str) -> list[int]:
    """Generations a worker of this host was running when it stopped: they will not finish (a worker that starts
    calls this, as it marks its leftover jobs interrupted)."""
    with write_session(settings) as ws:
        rows = ws.exec(
            select(Generation).where(Generation.host == host_name, Generation.status == "running")
        ).all()
        for gen in rows:
            gen.status, gen.finished_at = "failed", utcnow()
            gen.error = f"the worker on {host_name} stopped while it answered; ask again"
            ws.add(gen)
    return [g.id for g in rows]
