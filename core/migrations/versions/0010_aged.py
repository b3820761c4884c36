"""clearings: the aged stage (one row per message and stage)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

A tool result goes full -> aged (its head and tail within ``kept_chars`` characters) -> cleared,
each step its own row; an assistant message whose old tool-call arguments are shortened has an
``arguments`` row beside any other. Every row before this revision is a ``cleared`` one, and the
unique key becomes (message, stage).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clearings", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("stage", sa.String(length=16), nullable=False, server_default="cleared")
        )
        batch_op.add_column(sa.Column("kept_chars", sa.Integer(), nullable=True))
        batch_op.drop_constraint("uq_clearings_message", type_="unique")
        batch_op.create_unique_constraint("uq_clearings_message_stage", ["message_id", "stage"])


def downgrade() -> None:
    op.execute("DELETE FROM clearings WHERE stage <> 'cleared'")  # the steps this schema lacks
    with op.batch_alter_table("clearings", schema=None) as batch_op:
        batch_op.drop_constraint("uq_clearings_message_stage", type_="unique")
        batch_op.create_unique_constraint("uq_clearings_message", ["message_id"])
        batch_op.drop_column("kept_chars")
        batch_op.drop_column("stage")
