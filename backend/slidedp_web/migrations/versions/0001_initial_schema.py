"""Initial schema: jobs, their status history, metrics, log lines and events; worker hosts.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=True),
        sa.Column("policy", sa.JSON(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("started_at"),
        _ts("finished_at"),
        _ts("heartbeat_at"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("last_metrics", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("output_dir", sa.String(4096), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cancel_request", sa.String(8), nullable=True),
        _ts("cancel_requested_at"),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("log_seq", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "job_status_history",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _ts("ts", nullable=False),
        sa.Column("message", sa.String(), nullable=True),
    )
    op.create_index("ix_job_status_history_job", "job_status_history", ["job_id", "id"])
    op.create_table(
        "job_metrics",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        _ts("ts", nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.UniqueConstraint("job_id", "step", name="uq_job_metrics_job_step"),
    )
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        _ts("ts", nullable=False),
        sa.Column("line", sa.String(), nullable=False),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_logs_job_seq"),
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        _ts("ts", nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),
    )
    op.create_table(
        "hosts",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("topology", sa.JSON(), nullable=True),
        sa.Column("calibration", sa.JSON(), nullable=True),
        _ts("started_at"),
        _ts("last_seen"),
        sa.Column("current_job_id", sa.Integer(), nullable=True),
    )


def downgrade() -> None:
    for table in ("hosts", "job_events", "job_logs", "job_metrics", "job_status_history", "jobs"):
        op.drop_table(table)
