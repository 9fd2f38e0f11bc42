"""Jobs own their output folders: owner token, what the job created, its init_from source, the next action.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner_token", sa.String(64), nullable=True))
        batch.add_column(sa.Column("outputs", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("init_from_job", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("action", sa.String(16), nullable=False, server_default="train"))
        batch.create_index("ix_jobs_init_from_job", ["init_from_job"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_init_from_job")
        batch.drop_column("action")
        batch.drop_column("init_from_job")
        batch.drop_column("outputs")
        batch.drop_column("owner_token")
