"""memories: what Recap keeps about a user across conversations

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

``memories`` holds a user's keyed entries (text, tokens, how often written, and the
conversation and message that last wrote one); ``memory_runs`` one row per extraction that
wrote its result (unique per user, conversation and turn: a redelivered task writes nothing
twice); ``memory_users`` a user's own switch. Both tables that name a conversation are erased
with it (``recap delete``, the retention policy).
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NAME = sqlmodel.sql.sqltypes.AutoString(length=255)


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", ID, nullable=False),
        sa.Column("user_id", NAME, nullable=False),
        sa.Column("key", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("conversation_id", NAME, nullable=True),
        sa.Column("message_id", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user_id", "key", name="uq_memories_user_key"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_memories_user_id"), ["user_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_memories_conversation_id"), ["conversation_id"], unique=False
        )
    op.create_table(
        "memory_runs",
        sa.Column("id", ID, nullable=False),
        sa.Column("user_id", NAME, nullable=False),
        sa.Column("conversation_id", NAME, nullable=False),
        sa.Column("message_id", ID, nullable=False),
        sa.Column("task_id", NAME, nullable=True),
        sa.Column("edits", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "user_id", "conversation_id", "message_id", name="uq_memory_runs_turn"
        ),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("memory_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_memory_runs_conversation_id"), ["conversation_id"], unique=False
        )
    op.create_table(
        "memory_users",
        sa.Column("user_id", NAME, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_id"),
    )


def downgrade() -> None:
    op.drop_table("memory_users")
    with op.batch_alter_table("memory_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memory_runs_conversation_id"))
    op.drop_table("memory_runs")
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memories_conversation_id"))
        batch_op.drop_index(batch_op.f("ix_memories_user_id"))
    op.drop_table("memories")
