"""attach and merge: attach pointers in the tree and merge commits

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

``Recap.attach`` appends two marker messages to a conversation's branch (the open and the close
marker) and one ``attachments`` row naming the source conversation (its incarnation) and the
leaf its branch ends at (with its stored tokens, which the compression's early bound counts);
assembly expands the source's messages between the markers.
``Recap.merge`` attaches each peer branch the same way (``kind`` merge, the base one
``locked``) and records one ``merges`` row: the target's previous head, the peers' heads, the
instruction message, and the reply that commits the merge once it is added.

A clearing is now one row per conversation, message and stage: an attached message may be
cleared in the conversation it is attached to and in its own, each for its own requests.
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NAME = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "attachments",
        sa.Column("id", ID, nullable=False),
        sa.Column("conversation_id", NAME(length=255), nullable=False),
        sa.Column("open_message_id", ID, nullable=False),
        sa.Column("close_message_id", ID, nullable=False),
        sa.Column("source_conversation_id", NAME(length=255), nullable=False),
        sa.Column("source_incarnation", NAME(length=32), nullable=True),
        sa.Column("source_leaf_id", ID, nullable=True),
        sa.Column("source_tokens", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("kind", NAME(length=16), nullable=False),
        sa.Column("locked", sa.Boolean(), nullable=False),
        sa.Column("merge_id", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("attachments", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_attachments_conversation_id"), ["conversation_id"], unique=False
        )
    op.create_table(
        "merges",
        sa.Column("id", ID, nullable=False),
        sa.Column("conversation_id", NAME(length=255), nullable=False),
        sa.Column("base_head_id", ID, nullable=True),
        sa.Column("instruction_message_id", ID, nullable=False),
        sa.Column("peers", sa.JSON(), nullable=False),
        sa.Column("commit_message_id", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"]),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("merges", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_merges_conversation_id"), ["conversation_id"], unique=False
        )
    # SQLite rebuilds the table for a new constraint: it keeps AUTOINCREMENT and the highest id
    # ever handed out (sqlite_sequence), so an erased clearing's id never returns
    seq = _sequence("clearings")
    with op.batch_alter_table(
        "clearings", schema=None, table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.drop_constraint("uq_clearings_message_stage", type_="unique")
        batch_op.create_unique_constraint(
            "uq_clearings_message_stage", ["conversation_id", "message_id", "stage"]
        )
    _restore_sequence("clearings", seq)


def _sequence(table: str) -> int | None:
    """SQLite's highest id handed out in ``table`` (None elsewhere, or when none was)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return None
    found = bind.execute(
        sa.text("SELECT seq FROM sqlite_sequence WHERE name = :name"), {"name": table}
    ).scalar()
    return int(found) if found is not None else None


def _restore_sequence(table: str, seq: int | None) -> None:
    """Put back what ``_sequence`` read, after a rebuild started the count at the highest row."""
    if seq is None:
        return
    bind = op.get_bind()
    values = {"name": table, "seq": seq}
    updated = bind.execute(
        sa.text("UPDATE sqlite_sequence SET seq = max(seq, :seq) WHERE name = :name"), values
    )
    if not updated.rowcount:
        bind.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES (:name, :seq)"), values
        )


def downgrade() -> None:
    seq = _sequence("clearings")
    with op.batch_alter_table(
        "clearings", schema=None, table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.drop_constraint("uq_clearings_message_stage", type_="unique")
        batch_op.create_unique_constraint("uq_clearings_message_stage", ["message_id", "stage"])
    _restore_sequence("clearings", seq)
    with op.batch_alter_table("merges", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_merges_conversation_id"))
    op.drop_table("merges")
    with op.batch_alter_table("attachments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attachments_conversation_id"))
    op.drop_table("attachments")
