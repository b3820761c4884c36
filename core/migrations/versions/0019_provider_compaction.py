"""summaries.provider_items: the provider's own compaction of a summary's span

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

With ``RECAP_PROVIDER_COMPACTION=auto`` a compression run asks the conversation's provider to
compact the span it summarizes and stores the provider's items beside the readable summary of
the same cutoff (``core.compression.provider``). Rows written before read NULL: no provider
item, the readable summary everywhere, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN on every database: SQLite keeps the table and its AUTOINCREMENT
    op.add_column("summaries", sa.Column("provider_items", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("summaries", "provider_items")  # SQLite's own DROP COLUMN (3.35 on)
