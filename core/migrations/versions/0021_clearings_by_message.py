"""clearings: an index by message id in place of the one by conversation

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

Migration 0016 keyed clearings by (conversation, message, stage), so the unique index no longer
began with the message id, and the idle sweep's per-batch statements that read back what a
batch wrote (a range of message ids: what it counted, and on PostgreSQL the rows filed under a
conversation erased and created again meanwhile) scanned the whole table, once per batch. An
index on ``message_id`` serves those ranges. The index on ``conversation_id`` alone goes: the
unique index begins with that column and serves every lookup by conversation (erasure, the
foreign key's checks) as well.
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_clearings_message_id", "clearings", ["message_id"])
    op.drop_index("ix_clearings_conversation_id", table_name="clearings")


def downgrade() -> None:
    op.create_index("ix_clearings_conversation_id", "clearings", ["conversation_id"])
    op.drop_index("ix_clearings_message_id", table_name="clearings")
