"""messages: a covering index for the request version

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

Every assembly reads the conversation's request version first (``core.storage.versions``): per
counting basis, the messages' count, highest id and token sum. Without this index the read
visits each message row of the conversation in the table, whose pages hold the content; with
it the aggregate reads the index alone (a 260-message conversation's version in about 60 % of
the time, and the gap grows with the conversation).
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_messages_conversation_version",
            ["conversation_id", "encoding", "id", "tokens"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_conversation_version")
