"""messages: a partial index of tool results, for the idle sweep

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

The idle sweep walks every tool result in id order, a window at a time, and reads which
conversations each window touches and each conversation's newest results. Tool results are about
a quarter of the messages; without this index each window read the whole id range from the table
to find them. The index holds only tool results (id, conversation), so finding a window and the
conversations in it never touches the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TOOL_ONLY = sa.text("role = 'tool'")


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_messages_tool_results",
            ["id", "conversation_id"],
            unique=False,
            postgresql_where=TOOL_ONLY,
            sqlite_where=TOOL_ONLY,
        )


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_tool_results")
