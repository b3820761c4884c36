"""request_profiles and compaction_log: the request's prefix as sent, the summarizer's cached input

Revision ID: 0020
Revises: 0018
Create Date: 2026-12-07

The summarizer's request is built on the chat's own prefix (``core.summaries.onprefix``) so the
provider's prompt cache serves it. The worker builds that prefix again from what the last
request was given beside the stored history: its system prompt, tool schemas, reminder and
rendering, kept as JSON on the request profile (written only when they change, erased with the
conversation). Each run's log row keeps the part of the summarizer's input read from the
provider's cache. Rows written before read NULL and 0: the old request shape, no cached input.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN on every database: SQLite keeps the tables and their AUTOINCREMENT
    op.add_column("request_profiles", sa.Column("sent_spec", sa.Text(), nullable=True))
    op.add_column(
        "request_profiles", sa.Column("sent_spec_hash", sa.String(length=64), nullable=True)
    )
    op.add_column(
        "compaction_log",
        sa.Column("cached_input_tokens", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("compaction_log", "cached_input_tokens")  # SQLite's own DROP COLUMN (3.35 on)
    op.drop_column("request_profiles", "sent_spec_hash")
    op.drop_column("request_profiles", "sent_spec")
