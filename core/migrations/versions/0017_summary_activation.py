"""summaries: a summary written when ready, used from the first request where that pays

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

A compression run writes its summary ``pending`` (ready, not yet in use); the first request
that uses it (``core.decision.activation``) clears the flag and stamps ``activated_at``. Rows
written before this revision, and summaries written any other way, are in use from the start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("summaries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("summaries", schema=None) as batch_op:
        batch_op.drop_column("activated_at")
        batch_op.drop_column("pending")
