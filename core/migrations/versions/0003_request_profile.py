"""request profiles: the fixed parts a host sends, per conversation

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

One row per conversation: the token counts and a hash of the system prompt, tools, reminder and
context files the host last passed to ``assemble``, the latest provider reading (for the
calibration factor), and the conversation's output reserve override.
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "request_profiles",
        sa.Column("conversation_id", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("system_tokens", sa.Integer(), nullable=False),
        sa.Column("tools_tokens", sa.Integer(), nullable=False),
        sa.Column("reminder_tokens", sa.Integer(), nullable=False),
        sa.Column("context_tokens", sa.Integer(), nullable=False),
        sa.Column("content_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("assembled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reserve_output_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_estimated_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_leaf_message_id", ID_TYPE, nullable=True),
        sa.Column("usage_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("conversation_id"),
    )


def downgrade() -> None:
    op.drop_table("request_profiles")
