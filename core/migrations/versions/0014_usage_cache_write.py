"""usage: the tokens each request wrote to the provider's cache

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

``record_usage`` stores the provider's cache-write tokens (Anthropic's cache creation) beside
the cached tokens it already stored, so ``stats`` can report what caching did over the
conversation's life. Rows recorded before this read 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cache_write_tokens", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.drop_column("cache_write_tokens")
