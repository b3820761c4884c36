"""conversations: an incarnation; SQLite ids never handed out twice

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

A conversation's identity is its id and its incarnation: a random token drawn when the row is
created. A compression run reads it when it takes the lease, and each of its writes checks it in
the transaction it writes in, so a run that outlives a delete writes nothing, even into a
conversation created again under the same id (``core.storage.store.lock_conversation``). Rows
stored before this revision get a token of their own here.

SQLite hands out ``max(id) + 1`` for an ``INTEGER PRIMARY KEY`` unless the table says
``AUTOINCREMENT``: deleting a conversation whose messages were the newest gave their ids to the
next messages stored, and a run's cutoff, a clearing or a recall reference naming an erased
message then named a stranger's. The tables whose ids are kept across transactions are rebuilt
with ``AUTOINCREMENT`` (their rows, ids and indexes kept); ``sqlite_sequence`` starts at the
highest id stored now, so ids erased before this revision, above every id still stored, are the
only ones that can come back. PostgreSQL's sequences never hand out an id twice.

On SQLite the column is added with an empty default (``ALTER TABLE ADD COLUMN`` takes only a
constant one, and rebuilding the conversations table would empty the tables referring to it):
Recap always writes the column itself.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

KEYED_TABLES = ("messages", "summaries", "clearings", "pins", "compaction_log", "usage")
TOKEN = {  # 32 hex characters, random, per row
    "sqlite": "lower(hex(randomblob(16)))",
    "postgresql": "md5(random()::text || clock_timestamp()::text || id)",
}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.add_column(
            "conversations",
            sa.Column("incarnation", sa.String(32), nullable=False, server_default=""),
        )
    else:
        op.add_column("conversations", sa.Column("incarnation", sa.String(32), nullable=True))
    op.execute(f"UPDATE conversations SET incarnation = {TOKEN.get(dialect, TOKEN['postgresql'])}")
    if dialect != "sqlite":
        op.alter_column("conversations", "incarnation", nullable=False)
        return
    for name in KEYED_TABLES:
        with op.batch_alter_table(
            name, recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ):
            pass


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_column("conversations", "incarnation")
        return
    for name in KEYED_TABLES:
        with op.batch_alter_table(
            name, recreate="always", table_kwargs={"sqlite_autoincrement": False}
        ):
            pass
    # SQLite's own DROP COLUMN (3.35 on): a rebuilt conversations table would empty the tables
    # referring to it
    op.execute("ALTER TABLE conversations DROP COLUMN incarnation")
