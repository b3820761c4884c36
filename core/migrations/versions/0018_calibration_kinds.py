"""usage and request_profiles: the composition of requests by kind of content

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

The calibration learns one factor per kind of content (prose, code and JSON, digit runs, dense
strings: ``core.counting.calibration``). Each usage row keeps the composition of the request it
measured, the request profile the composition of the request last assembled and the rates
fitted over the recent readings. Rows written before read NULL: those readings calibrate with
the single factor, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN on every database: SQLite keeps the tables and usage's AUTOINCREMENT
    op.add_column("usage", sa.Column("kinds", sa.String(length=96), nullable=True))
    op.add_column("request_profiles", sa.Column("sent_kinds", sa.String(length=96), nullable=True))
    op.add_column("request_profiles", sa.Column("usage_kinds", sa.String(length=96), nullable=True))


def downgrade() -> None:
    op.drop_column("request_profiles", "usage_kinds")  # SQLite's own DROP COLUMN (3.35 on)
    op.drop_column("request_profiles", "sent_kinds")
    op.drop_column("usage", "kinds")
