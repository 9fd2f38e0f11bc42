"""A job whose stored plan is in the legacy shape (a run's policy keys at the top level, written before the resolved
policy had a shape of its own) and is resumed: the API answers the new run's resolved policy (docs/interfaces.md §6,
`policy`), not the old run's. The job is created through the API and driven the way the worker drives it: claimed
(tasks.claim), ended by outcome.finish, resumed through the API."""

from __future__ import annotations

from backend_support import tiny_job
from slidedp_web import tasks
from slidedp_web.core.db import read_session, write_session
from slidedp_web.models import JobRecord
from slidedp_web.outcome import finish
from slidedp_web.planning import LEGACY_RUN_KEYS, job_policy

# What an older finish left in the column: the preview made at submit time ("stage": "planned", its own "policy")
# merged with the run's resolved keys at the top level and the runtime's plan under "plan".
PREVIEW_POLICY = {"delivery": "replicated", "grad_reduce": "host", "window": 2}
OLD_RUN = {
    "delivery": "replicated",
    "grad_reduce": "host",
    "reduce_dtype": "fp32",
    "activations": ["keep", "checkpoint"],
    "resident": [True, False],
    "window": 2,
    "chunk_mb": 64,
    "loss_chunk_tokens": 2048,
    "staging_slots": 8,
}
LEGACY_ROW = {
    "feasible": True,
    "policy": PREVIEW_POLICY,
    "why": "planned at submit",
    "errors": [],
    "host": "node-a",
    "stage": "planned",
    **OLD_RUN,
    "keep_layers": 1,
    "plan": {"why": "planned at start"},
}
# What today's run reports (job_process._trained_outcome): its plan with "stage": "resolved" and the
# ExecutionPolicy it ran, here one that differs from the old run's in every routed choice.
NEW_POLICY = {
    "delivery": "sharded",
    "grad_reduce": "gpu",
    "delivery_cast": "device",
    "edge_update": "device",
    "device_layers": 1,
    "activations": ["checkpoint", "checkpoint"],
    "resident": [False, False],
    "window": 3,
    "chunk_mb": 32,
    "loss_chunk_tokens": 1024,
    "staging_slots": 4,
}
NEW_RESOLVED = {"feasible": True, "why": "planned again at resume", "errors": [], "stage": "resolved",
                "policy": NEW_POLICY}


def _store_plan(settings, job_id: int, plan: dict) -> None:
    with write_session(settings) as session:
        job = session.get(JobRecord, job_id)
        job.plan = plan
        session.add(job)


def _stored_plan(settings, job_id: int) -> dict:
    with read_session(settings) as session:
        return session.get(JobRecord, job_id).plan


def test_a_resumed_legacy_job_answers_the_new_run_s_policy(client, settings, dataset):
    job_id = client.post("/api/jobs", json=tiny_job(dataset, name="legacy")).json()["id"]
    assert tasks.claim(settings, job_id, 1) is not None
    finish(settings, job_id, 1, {"status": "failed", "error": {"message": "rank 0 failed", "errors": []}},
           None, False, 0)
    _store_plan(settings, job_id, LEGACY_ROW)  # the row as an older finish wrote it
    before = client.get(f"/api/jobs/{job_id}").json()["policy"]
    assert before["stage"] == "resolved" and before["policy"]["delivery"] == "replicated"

    assert client.post(f"/api/jobs/{job_id}/resume").json()["status"] == "queued"
    assert tasks.claim(settings, job_id, 2) is not None
    assert finish(settings, job_id, 2, {"status": "completed", "policy": NEW_RESOLVED}, None, False, 0) == "completed"

    answer = client.get(f"/api/jobs/{job_id}").json()["policy"]
    assert answer["stage"] == "resolved"
    assert answer["policy"] == NEW_POLICY
    assert answer["why"] == "planned again at resume"
    assert not LEGACY_RUN_KEYS & answer.keys()  # none of the old run's keys beside the new plan
    # The row itself now holds today's shape only: the old run's keys are gone from the column.
    stored = _stored_plan(settings, job_id)
    assert stored["policy"] == NEW_POLICY and not LEGACY_RUN_KEYS & stored.keys()
    # The plan kept from submit time that the new run did not restate is still there.
    assert stored["host"] == "node-a"


def test_a_row_holding_both_shapes_answers_the_newest_run_s_policy():
    """Rows a resume already wrote by merging today's resolved plan into a legacy one: the newest run's policy
    ("stage": "resolved" with "policy", which no legacy run wrote), without the old run's top-level keys."""
    both = {**LEGACY_ROW, **NEW_RESOLVED}
    answer = job_policy(both)
    assert answer["stage"] == "resolved"
    assert answer["policy"] == NEW_POLICY
    assert not LEGACY_RUN_KEYS & answer.keys()
    assert answer["host"] == "node-a" and answer["why"] == "planned again at resume"
    # A legacy row that was never resumed still reads the old run's policy, in today's shape.
    legacy = job_policy(LEGACY_ROW)
    assert legacy["stage"] == "resolved" and legacy["policy"]["delivery"] == "replicated"
    assert legacy["policy"]["window"] == 2 and "reduce_dtype" not in legacy["policy"]
