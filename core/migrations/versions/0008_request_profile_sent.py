"""request_profiles: the request last assembled, and the state a reading measured

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``assemble`` records Recap's count of the request it built (``sent_tokens``), the leaf it was
built for and a key of the state it was built from (model, leaf, summary, clearings, fixed
parts: ``sent_state``); ``record_usage`` compares the provider's reading with that count, never
with the stored history, and keeps the key beside the reading (``usage_state``), so a reading
stays "measured" only while the request it measured is what would be sent.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("request_profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sent_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sent_leaf_message_id", ID, nullable=True))
        batch_op.add_column(sa.Column("sent_state", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("usage_state", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_profiles", schema=None) as batch_op:
        batch_op.drop_column("usage_state")
        batch_op.drop_column("sent_state")
        batch_op.drop_column("sent_leaf_message_id")
        batch_op.drop_column("sent_tokens")
