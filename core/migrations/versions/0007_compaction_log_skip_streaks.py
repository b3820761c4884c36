"""compaction_log: a streak of skipped runs is one row

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

A host enqueues a run after every turn and most runs skip, so consecutive skipped runs of one
conversation are recorded on one row (``core.storage.compaction_log.record_run``): ``repeats`` counts the
runs it stands for (1 for every row written before this revision), ``last_seen_at`` is the latest
one's time (``created_at`` stays the first's).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("compaction_log", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("repeats", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
        batch_op.add_column(sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("compaction_log", schema=None) as batch_op:
        batch_op.drop_column("last_seen_at")
        batch_op.drop_column("repeats")
