"""Trying a job's model over REST: POST /api/jobs/{id}/generate is checked before anything is queued, answers
202 with a link, and the job's real worker answers it (tiny model, CPU) with the prompt formatted as the job
trained; behind a running job it waits, saying so; a checkpoint is converted into the job's own folder; a name
that leads out of the job's folder is refused; deleting the job drops its waiting prompts and its conversions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backend_support import tiny_job, wait_for, wait_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROMPT = "3 + 4 ="


def sft_job(dataset: Path, **overrides) -> dict:
    """The tiny model on the shipped demo task, as prompt_completion: its export has the tiny tokenizer."""
    return tiny_job(dataset, data={"path": "demo:demo_sft.jsonl", "format": "prompt_completion"}, **overrides)


@pytest.fixture(scope="module")
def finished(client, worker, dataset) -> dict:
    """A completed job with an export and a checkpoint of each of its 2 steps."""
    job = client.post("/api/jobs", json=sft_job(dataset, steps=2, checkpoint={"interval": 1, "keep": 2})).json()
    done = wait_status(client, job["id"], ("completed", "failed"), timeout=180)
    assert done["status"] == "completed", done["error"]
    assert done["checkpoints"] == ["step-00000001", "step-00000002"]
    return done


@pytest.fixture(scope="module")
def local():
    """The runtime's generation in this process: what the worker's answer must equal."""
    from slidedp.generate import Generator

    loaded: dict[str, Generator] = {}

    def answer(model_dir: str, prompt: str, max_new_tokens: int) -> str:
        if model_dir not in loaded:
            loaded[model_dir] = Generator(model_dir, "prompt_completion", "cpu")
        return loaded[model_dir](prompt, max_new_tokens).text

    return answer


def poll(client, url: str, statuses=("done", "failed"), timeout: float = 120) -> dict:
    def current():
        gen = client.get(url).json()
        return gen if gen["status"] in statuses else None

    return wait_for(current, timeout, f"{url} to become {' or '.join(statuses)}", interval=0.3)


def locs(resp) -> list[list]:
    return [e["loc"] for e in resp.json()["detail"]]


def generation_rows(settings) -> int:
    import sqlalchemy as sa
    from slidedp_web.core.db import read_session
    from slidedp_web.models import Generation

    with read_session(settings) as session:
        return session.execute(sa.select(sa.func.count()).select_from(Generation)).scalar_one()


def test_bad_generate_requests_are_refused_before_anything_is_queued(client, finished, settings, tmp_path):
    jid = finished["id"]
    url = f"/api/jobs/{jid}/generate"
    resp = client.post(url, json={"prompt": " ", "max_new_tokens": 0, "temperature": -1, "seed": "x", "top_k": 5})
    assert resp.status_code == 422
    assert sorted(locs(resp)) == sorted([["body", "top_k"], ["body", "prompt"], ["body", "max_new_tokens"],
                                         ["body", "seed"], ["body", "temperature"]])
    assert "from 1 to 1024" in resp.text and "unknown key; allowed: prompt, max_new_tokens" in resp.text
    assert client.post(url, json=["not", "an", "object"]).status_code == 422
    assert client.post(url, json={"prompt": "a\u0000b"}).status_code == 422
    assert client.post("/api/jobs/999999/generate", json={"prompt": PROMPT}).status_code == 404

    # A checkpoint is a name of the job's own, never a path: traversal is refused by its shape ...
    for bad in ("../../etc", "/etc/passwd", "step-1/../../x", "final", "step-"):
        resp = client.post(url, json={"prompt": PROMPT, "checkpoint": bad})
        assert resp.status_code == 422 and locs(resp) == [["body", "checkpoint"]], bad
        assert "paths are not accepted" in resp.text
    # ... a well-formed name the job does not have lists those it has ...
    resp = client.post(url, json={"prompt": PROMPT, "checkpoint": "step-00000009"})
    assert resp.status_code == 422 and "it has: step-00000001, step-00000002" in resp.text
    # ... and one planted in its folder as a symlink to files elsewhere is not followed.
    elsewhere = tmp_path / "step-00000077"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text("{}")
    (elsewhere / "master.f32").write_bytes(b"\0" * 16)
    planted = Path(finished["output_dir"]) / "checkpoints" / "step-00000077"
    planted.symlink_to(elsewhere)
    try:
        resp = client.post(url, json={"prompt": PROMPT, "checkpoint": "step-00000077"})
        assert resp.status_code == 422 and "has no checkpoint 'step-00000077' in its folder" in resp.text
        assert str(elsewhere) not in resp.text
    finally:
        planted.unlink()
    assert generation_rows(settings) == 0


def test_a_completed_job_answers_a_prompt_through_its_worker(client, finished, local):
    resp = client.post(f"/api/jobs/{finished['id']}/generate", json={"prompt": PROMPT, "max_new_tokens": 6})
    assert resp.status_code == 202, resp.text
    gen = resp.json()
    assert resp.headers["location"] == gen["url"] == f"/api/jobs/{finished['id']}/generations/{gen['id']}"
    assert (gen["status"], gen["prompt"], gen["max_new_tokens"], gen["temperature"], gen["checkpoint"]) == (
        "queued", PROMPT, 6, 0.0, None)
    final = os.path.join(finished["output_dir"], "final")
    expected = local(final, PROMPT, 6)  # meanwhile the worker answers
    done = poll(client, gen["url"])
    assert done["status"] == "done", done["error"]
    # prompt_completion trains on prompts as they are: the model reads the prompt unchanged
    assert (done["formatted_prompt"], done["format"]) == (PROMPT, "prompt_completion")
    assert done["text"] == expected
    assert 1 <= done["new_tokens"] <= 6 and done["stop"] in ("eos", "length")
    # the same note the runtime gives this answer: said for an empty or cut answer, none for a whole one
    from slidedp.generate import explain

    assert done["note"] == explain(done["text"], done["stop"], done["new_tokens"], 6, "prompt_completion", 0.0)
    assert (done["note"] is None) == (bool(done["text"].strip()) and done["stop"] == "eos")
    assert done["host"] == finished["host"] and done["created_at"] <= done["started_at"] <= done["finished_at"]
    t = done["timings"]
    assert t["load_s"] > 0 and t["generate_s"] > 0 and t["total_s"] >= t["queued_s"] >= 0 and "convert_s" not in t


def test_a_generation_waits_behind_the_running_job_and_converts_a_checkpoint(client, finished, dataset, settings,
                                                                             local):
    busy = client.post("/api/jobs", json=tiny_job(dataset, steps=100_000)).json()
    wait_status(client, busy["id"], ("running",), timeout=60)  # the host's one worker thread is taken
    resp = client.post(f"/api/jobs/{finished['id']}/generate",
                       json={"prompt": PROMPT, "max_new_tokens": 4, "checkpoint": "step-00000001"})
    assert resp.status_code == 202, resp.text
    gen = resp.json()
    assert gen["waiting"] == f"waiting for the running job {busy['id']} on host {settings.host_name}"
    assert gen["waiting_for_job"] == busy["id"]
    # another job's generation is not reachable through this job's id
    assert client.get(f"/api/jobs/{busy['id']}/generations/{gen['id']}").status_code == 404
    assert client.post(f"/api/jobs/{busy['id']}/generate", json={"prompt": PROMPT}).status_code == 409  # no export
    again = client.get(gen["url"]).json()
    assert again["status"] == "queued" and again["waiting_for_job"] == busy["id"]
    assert client.post(f"/api/jobs/{busy['id']}/cancel").status_code == 200
    ended = wait_status(client, busy["id"], ("cancelled",), timeout=120)
    done = poll(client, gen["url"])
    assert done["status"] == "done", done["error"]
    assert done["started_at"] >= ended["finished_at"]  # it ran once the job had left the host
    converted = Path(finished["output_dir"]) / "converted" / "step-00000001"
    assert (converted / "model.safetensors").is_file() and (converted / "slidedp_job.json").is_file()
    assert done["timings"]["convert_s"] > 0
    assert done["text"] == local(str(converted), PROMPT, 4)


def test_a_job_whose_model_is_answering_is_not_deleted_until_it_is_done(client, finished, settings):
    """While a generation reads the job's files (status running, as a worker's claim sets it), DELETE answers 409
    and keeps the job and its files; once the generation is over, the deletion goes through (the next test)."""
    from slidedp_web.core.db import write_session
    from slidedp_web.models import Generation, utcnow

    with write_session(settings) as ws:
        gen = Generation(job_id=finished["id"], status="running", queue="q", host=settings.host_name,
                         prompt=PROMPT, created_at=utcnow(), started_at=utcnow())
        ws.add(gen)
        ws.flush()
        gen_id = gen.id
    resp = client.delete(f"/api/jobs/{finished['id']}")
    assert resp.status_code == 409, resp.text
    assert f"answering a prompt (generation {gen_id})" in resp.json()["detail"]
    assert client.get(f"/api/jobs/{finished['id']}").status_code == 200
    assert (Path(finished["output_dir"]) / "final").is_dir()
    with write_session(settings) as ws:
        row = ws.get(Generation, gen_id)
        row.status = "done"
        ws.add(row)


def test_deleting_a_job_drops_its_waiting_prompts_and_conversions(client, finished, worker, settings):
    worker.stop()  # nothing takes the prompt: it stays queued
    resp = client.post(f"/api/jobs/{finished['id']}/generate", json={"prompt": PROMPT})
    assert resp.status_code == 202
    gen = resp.json()
    assert gen["waiting"] == f"waiting for the worker of host {settings.host_name} to take it"
    folder = Path(finished["output_dir"])
    assert (folder / "converted").is_dir()
    assert client.delete(f"/api/jobs/{finished['id']}").status_code == 204
    assert client.get(gen["url"]).status_code == 404
    assert not (folder / "converted").exists() and not (folder / "final").exists()
    assert client.post(f"/api/jobs/{finished['id']}/generate", json={"prompt": PROMPT}).status_code == 404
