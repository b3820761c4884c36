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
    # plain ADD COLUMN on every database: SQLite keeps the table (a rebuild would drop its
    # AUTOINCREMENT, and summary ids must never be handed out again)
    op.add_column(
        "summaries", sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("summaries", sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("summaries", "activated_at")  # SQLite's own DROP COLUMN (3.35 on)
    op.drop_column("summaries", "pending")
