"""messages: a content hash, to map a resent history onto the tree

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

`recap serve` receives a client's whole history every turn and finds the stored prefix it repeats
by a hash of each message; the index holds the hash, the parent and the id, so that lookup never
touches the table. Conversations record the fingerprint of the client key that created them.
Messages stored before this revision carry no hash: a resent history matches only messages
stored from now on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content_hash", sa.String(length=32), nullable=True))
        batch_op.create_index(
            "ix_messages_conversation_hash",
            ["conversation_id", "content_hash", "parent_id", "id"],
            unique=False,
        )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("owner")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_conversation_hash")
        batch_op.drop_column("content_hash")
