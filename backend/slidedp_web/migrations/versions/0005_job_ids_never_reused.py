"""Job ids are never handed out twice: SQLite's AUTOINCREMENT on jobs.id.

Without it SQLite gives a new row the largest id in the table plus one, so deleting the newest job made its id
the next job's, and the old job's URLs, tickets and SSE cursors then pointed at the new one. With AUTOINCREMENT
the largest id ever used is kept (sqlite_sequence). Postgres takes ids from the column's sequence, which never
goes back: nothing to change there.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table("jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}):
        pass  # the table is made again, AUTOINCREMENT on, its rows copied
    # The copy leaves the sequence at the largest id left; a deleted job a kept job starts from (init_from) is
    # known to have used a larger one.
    conn = op.get_bind()
    used = conn.execute(sa.text("SELECT max(coalesce(max(id), 0), coalesce(max(init_from_job), 0)) FROM jobs"))
    top = int(used.scalar() or 0)
    conn.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'jobs'"))
    conn.execute(sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :top)"), {"top": top})


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table("jobs", recreate="always", table_kwargs={"sqlite_autoincrement": False}):
        pass
