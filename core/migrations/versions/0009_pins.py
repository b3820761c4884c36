"""pins: messages sent verbatim in every request of their branches

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

A pinned message (``Recap.pin``, ``recap pin``) is sent as stored in every request of a branch
that holds it: in its place, or right after the summary once a summary covers it; it is never
cleared, aged or shortened. One row per pinned message; unpinning deletes the row.
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "pins",
        sa.Column("id", ID, nullable=False),
        sa.Column("conversation_id", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("message_id", ID, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("message_id", name="uq_pins_message"),
    )
    with op.batch_alter_table("pins", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_pins_conversation_id"), ["conversation_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("pins", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pins_conversation_id"))
    op.drop_table("pins")
