"""A job's stored plan is JobRecord.plan in Python and the jobs table's `policy` column in the database, as the
first migration made it: rows stored before the attribute had its name load with their plan, and new rows are
written where older code and the migrations look for it. The database is the real one a deployment has
(SQLite brought to the newest migration by Alembic)."""

from __future__ import annotations

import json

import sqlalchemy as sa
from backend_support import make_settings

PLANNED = {"feasible": True, "stage": "planned", "policy": {"delivery": "replicated", "grad_reduce": "host"},
           "why": "stored under the old name"}


def test_a_row_stored_in_the_policy_column_loads_as_the_job_s_plan(tmp_path):
    from slidedp_web.core.db import get_engine, read_session, upgrade, write_session
    from slidedp_web.jobs import public
    from slidedp_web.models import JobRecord, utcnow

    settings = make_settings(tmp_path / "data", "redis://127.0.0.1:9/0")  # no queue is touched
    upgrade(settings)
    with get_engine(settings).begin() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
        assert "policy" in columns and "plan" not in columns  # the schema the migrations made
        conn.execute(
            sa.text(
                "INSERT INTO jobs (status, config, queue, policy, created_at, step, steps, output_dir, attempt, "
                "event_seq, log_seq, action) VALUES ('completed', :config, 'q', :policy, :created, 0, 4, '/tmp/x', "
                "1, 0, 0, 'train')"
            ),
            {"config": json.dumps({"model": "tiny-qwen3"}), "policy": json.dumps(PLANNED), "created": utcnow()},
        )
    with read_session(settings) as session:
        [old] = session.exec(sa.select(JobRecord)).scalars().all()
        assert old.plan == PLANNED
        assert public(old).policy == PLANNED  # the API's field keeps its name

    with write_session(settings) as session:
        new = JobRecord(status="queued", config={"model": "tiny-qwen3"}, queue="q", plan={"stage": "unplanned"},
                        created_at=utcnow(), steps=4, output_dir="/tmp/y")
        session.add(new)
        session.flush()
        new_id = new.id
    with get_engine(settings).connect() as conn:
        stored = conn.execute(sa.text("SELECT policy FROM jobs WHERE id = :id"), {"id": new_id}).scalar_one()
    assert json.loads(stored) == {"stage": "unplanned"}
