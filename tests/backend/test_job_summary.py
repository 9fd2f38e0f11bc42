"""The jobs list's per-job summary (docs/interfaces.md §6, `summary`): final loss, final eval loss, median tokens/s
without the warm-up step, and the time run over every attempt. The jobs are created through the API and driven the
way the worker drives them: claimed (tasks.claim), their records stored by journal.record_metrics (what the job
process's on_step calls), finished by the worker's own ending (outcome.finish), a failed one resumed through the API."""

from __future__ import annotations

import math
import time
from datetime import datetime

import pytest
import sqlalchemy as sa
from backend_support import tiny_job
from slidedp_web import job_summary, tasks
from slidedp_web.core.db import read_session
from slidedp_web.journal import record_metrics
from slidedp_web.models import JobRecord
from slidedp_web.outcome import finish
from sqlmodel import select


def _ts(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _ran(job: dict) -> float:
    return (_ts(job["finished_at"]) - _ts(job["started_at"])).total_seconds()


def _attempt(
    settings, job_id: int, attempt: int, records: list[dict], outcome: dict | None, pause: float = 0.0
):
    """One attempt as the worker runs it: claimed, its steps recorded, then ended with `outcome` (None: left
    running)."""
    assert tasks.claim(settings, job_id, attempt) is not None
    for record in records:
        record_metrics(settings, job_id, record)
    time.sleep(pause)
    if outcome is not None:
        finish(settings, job_id, attempt, outcome, None, False, 0)


def _rec(step: int, loss: float, tokens_per_s: float, first: bool = False, **extra) -> dict:
    record = {"step": step, "loss": loss, "tokens_per_s": tokens_per_s, "step_time_s": 0.1, **extra}
    if first:  # the runtime puts the start-up's stages on each run's first record
        record["startup_s"] = {"planning": 0.1, "first_step": 0.2}
    return record


def _listed(client, **params) -> dict[int, dict]:
    resp = client.get("/api/jobs", params=params)
    assert resp.status_code == 200, resp.text
    return {j["id"]: j for j in resp.json()["items"]}


def test_the_list_summarises_each_run_in_two_queries(client, settings, dataset):
    ids = [client.post("/api/jobs", json=tiny_job(dataset, steps=6, name=n)).json()["id"] for n in "abcd"]
    evaluated, resumed, diverged, waiting = ids

    # Evaluated after steps 2 and 4 (step 5's evaluation had no target: null); the warm-up step is the fastest.
    _attempt(
        settings,
        evaluated,
        1,
        [
            _rec(1, 6.0, 9000.0, first=True, eval_loss_start=6.5),
            _rec(2, 4.0, 200.0, eval_loss=4.5),
            _rec(3, 3.0, 300.0),
            _rec(4, 2.5, 100.0, eval_loss=3.25),
            _rec(5, 2.0, 400.0, eval_loss=None),
            _rec(6, 1.75, 350.0),
        ],
        {"status": "completed"},
        pause=0.2,
    )
    # Failed after step 4 (checkpoint at 2), resumed: steps 3 and 4 run again and replace the first attempt's.
    _attempt(
        settings,
        resumed,
        1,
        [_rec(1, 5.0, 50.0, first=True), _rec(2, 4.0, 60.0), _rec(3, 9.0, 70.0), _rec(4, 9.5, 80.0)],
        {"status": "failed", "error": {"message": "rank 0 failed", "errors": []}},
        pause=0.2,
    )
    first_run = client.get(f"/api/jobs/{resumed}").json()
    assert first_run["status"] == "failed"
    time.sleep(0.6)  # queued again for a while: not running time
    assert client.post(f"/api/jobs/{resumed}/resume").json()["status"] == "queued"
    _attempt(
        settings,
        resumed,
        2,
        [_rec(3, 3.5, 110.0, first=True), _rec(4, 3.0, 120.0), _rec(5, 2.5, 130.0), _rec(6, 2.25, 140.0)],
        {"status": "completed"},
        pause=0.2,
    )
    second_run = client.get(f"/api/jobs/{resumed}").json()
    # The last step's loss was not finite (stored as null): no final loss, rather than an older one.
    _attempt(
        settings,
        diverged,
        1,
        [_rec(1, 6.0, 10.0, first=True), _rec(2, math.nan, 30.0)],
        None,
    )

    listed = _listed(client)
    done = client.get(f"/api/jobs/{evaluated}").json()
    assert listed[evaluated]["summary"] == {
        "final_loss": 1.75,
        "final_eval_loss": 3.25,
        "final_eval_step": 4,
        "median_tokens_per_s": 300.0,  # of 200, 300, 100, 400, 350: step 1 left out
        "duration_s": pytest.approx(_ran(done), abs=0.02),
    }
    assert listed[evaluated]["summary"]["duration_s"] >= 0.2

    # The resumed job's figures are those of the records its charts draw: steps 1, 2 of the first attempt, 3 to 6
    # of the second; its time run is both attempts' and not the 0.6 s it waited between them.
    steps = client.get(f"/api/jobs/{resumed}/metrics").json()["items"]
    assert [(r["step"], r["loss"]) for r in steps] == [
        (1, 5.0),
        (2, 4.0),
        (3, 3.5),
        (4, 3.0),
        (5, 2.5),
        (6, 2.25),
    ]
    summary = listed[resumed]["summary"]
    assert summary["final_loss"] == 2.25
    assert summary["final_eval_loss"] is None and summary["final_eval_step"] is None
    assert summary["median_tokens_per_s"] == 120.0  # of 60, 110, 120, 130, 140
    assert summary["duration_s"] == pytest.approx(_ran(first_run) + _ran(second_run), abs=0.02)
    assert (
        summary["duration_s"]
        < (_ts(second_run["finished_at"]) - _ts(first_run["started_at"])).total_seconds() - 0.5
    )

    # Still running: its time run grows between two answers; its one step after the warm-up gives the rate.
    running = listed[diverged]["summary"]
    assert running["final_loss"] is None and running["median_tokens_per_s"] == 30.0
    time.sleep(0.3)
    later = _listed(client)[diverged]["summary"]["duration_s"]
    assert later >= running["duration_s"] + 0.25

    # Queued and never run: nothing to say yet.
    assert listed[waiting]["summary"] == {
        "final_loss": None,
        "final_eval_loss": None,
        "final_eval_step": None,
        "median_tokens_per_s": None,
        "duration_s": None,
    }
    # A page of one job carries the same figures as the full page (newest first: the evaluated job is 4th).
    [only] = client.get("/api/jobs", params={"limit": 1, "offset": 3}).json()["items"]
    assert only["id"] == evaluated and only["summary"] == listed[evaluated]["summary"]

    # However many jobs a page holds: one query for the stored steps and one for the status history; the steps
    # of a job that has not changed since (same last event) are not read again.
    finish(
        settings,
        diverged,
        1,
        {"status": "failed", "error": {"message": "diverged", "errors": []}},
        None,
        False,
        0,
    )
    job_summary._cache.clear()
    with read_session(settings) as session:
        jobs = session.exec(select(JobRecord).where(JobRecord.id.in_(ids))).all()
        statements: list[str] = []
        conn = session.connection()
        sa.event.listen(conn, "before_cursor_execute", lambda *a: statements.append(a[2]))
        cold = job_summary.summaries(session, jobs)
        assert len(statements) == 2
        assert sum("job_metrics" in s for s in statements) == 1
        statements.clear()
        warm = job_summary.summaries(session, jobs)
        assert len(statements) == 1 and "job_status_history" in statements[0]
    assert cold == warm
    assert cold[evaluated].final_eval_loss == 3.25 and cold[resumed].final_loss == 2.25
