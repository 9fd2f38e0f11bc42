"""Prompts for a job's trained model: ask (202 and a link), then poll for the answer (slidedp_web/generations.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response

from slidedp_web import generations
from slidedp_web.api.deps import DB_INT_MAX, JobId, SessionDep, SettingsDep
from slidedp_web.models import GenerationPublic

router = APIRouter(prefix="/jobs", tags=["generations"])
GenerationId = Annotated[int, Path(ge=0, le=DB_INT_MAX, description="The generation's id")]

REQUEST_SCHEMA = {
    "title": "GenerateRequest",
    "type": "object",
    "additionalProperties": False,
    "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": generations.MAX_PROMPT_CHARS, "pattern": r"\S",
                   "description": "The text to answer, formatted as the job's data.format formatted its training "
                   "examples (prompt_completion: as it is; alpaca: as the instruction; chat: one user turn)."},
        "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": generations.MAX_NEW_TOKENS, "default": 64},
        "temperature": {"type": "number", "minimum": 0, "maximum": generations.MAX_TEMPERATURE, "default": 0,
                        "description": "0: greedy; above 0: sampled from softmax(logits / temperature), seeded."},
        "seed": {"type": "integer", "minimum": 0, "maximum": generations.SEED_MAX, "default": 0},
        "checkpoint": {"anyOf": [{"type": "string", "pattern": generations.CHECKPOINT_NAME.pattern}, {"type": "null"}],
                       "default": None,
                       "description": "A checkpoint of the job by name (step-00000020), converted to a model once; "
                       "null: the job's export (final/)."},
    },
}


@router.post(
    "/{job_id}/generate",
    status_code=202,
    response_model=GenerationPublic,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": REQUEST_SCHEMA}}}},
    responses={
        409: {"description": "The job has no export (or it changed since), or its model has no tokenizer"},
        429: {"description": "Too many prompts of this job are waiting"},
        503: {"description": "Redis is unreachable; nothing was queued"},
    },
)
def generate(job_id: JobId, session: SessionDep, settings: SettingsDep, response: Response,
             body: Any = Body(...)) -> GenerationPublic:
    """Answer a prompt with the job's trained model, on the job's host, through its queue (behind a job that runs
    there). Poll the answer's `url`."""
    gen = generations.create(settings, session, job_id, body)
    response.headers["Location"] = generations.url(gen)
    return generations.public(session, gen)


@router.get("/{job_id}/generations/{generation_id}", response_model=GenerationPublic)
def get_generation(job_id: JobId, generation_id: GenerationId, session: SessionDep) -> GenerationPublic:
    """A generation: queued (with what it waits for), running, done (the formatted prompt, the answer, timings)
    or failed (why)."""
    return generations.public(session, generations.get_or_404(session, job_id, generation_id))
