"""Run health and start-up: the warnings a job's steps raised (loss spikes, dead gradients) and the stage its
attempt is in while it starts, kept with the job.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("warnings", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("stage", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("stage")
        batch.drop_column("warnings")
