"""Generations: prompts for a job's trained model, answered on the job's host through its queue, with the
formatted prompt, the answer and its timings.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "generations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("max_new_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("checkpoint", sa.String(32), nullable=True),
        sa.Column("formatted_prompt", sa.Text(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("timings", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("started_at"),
        _ts("finished_at"),
    )
    op.create_index("ix_generations_job_id", "generations", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_generations_job_id", table_name="generations")
    op.drop_table("generations")
