"""messages: a covering index for branch walks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

The request path walks a conversation's tree from ids and parents alone; with the parent in the
index that read never touches the table. It also serves every (conversation_id, id) range query,
so it replaces the narrower index.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_messages_conversation_tree", ["conversation_id", "id", "parent_id"], unique=False
        )
        batch_op.drop_index("ix_messages_conversation_id_id")


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_messages_conversation_id_id", ["conversation_id", "id"], unique=False
        )
        batch_op.drop_index("ix_messages_conversation_tree")
