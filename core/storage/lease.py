"""Single flight: one compression run per conversation at a time.

The lease is a pair of columns on the conversation row, taken with one conditional ``UPDATE``
(atomic on SQLite and PostgreSQL alike), so no lock is held across the model call. A run that
finds the lease held marks the conversation ``dirty`` and returns ``busy``; the holder clears
``dirty`` when it starts and, before it lets go, re-checks when it finds it set again. A lease
outlives the run's own deadline (``Settings.run_seconds``, kept on every pool, threads
included) and Celery's hard limit, so only a dead run's lease ever expires.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, or_, select, update

from recap.core.errors import NotFoundError
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS

ACQUIRE_TRIES = 3  # the holder may let go between a failed take and marking dirty: try again


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this run holds on one conversation."""

    conversation_id: str
    owner: str
    expires_at: datetime


def new_owner() -> str:
    """A unique owner token for one run."""
    return uuid.uuid4().hex


def take(
    connection: Connection, conversation_id: str, *, owner: str, now: datetime, seconds: int
) -> Lease | None:
    """Take the lease if it is free or expired (one conditional UPDATE), clearing ``dirty``."""
    c = CONVERSATIONS.c
    expires = now + timedelta(seconds=seconds)
    statement = (
        update(CONVERSATIONS)
        .where(
            c.id == conversation_id,
            or_(c.lease_owner.is_(None), c.lease_expires_at.is_(None), c.lease_expires_at < now),
        )
        .values(lease_owner=owner, lease_expires_at=expires, dirty=False)
    )
    if connection.execute(statement).rowcount != 1:
        return None
    return Lease(conversation_id, owner, expires)


def mark_dirty(connection: Connection, conversation_id: str, now: datetime) -> bool:
    """Set ``dirty`` while someone holds a live lease; False when nobody does any more."""
    c = CONVERSATIONS.c
    statement = (
        update(CONVERSATIONS)
        .where(c.id == conversation_id, c.lease_owner.is_not(None), c.lease_expires_at >= now)
        .values(dirty=True)
    )
    return connection.execute(statement).rowcount == 1


def acquire(
    engine: Engine, conversation_id: str, *, owner: str, now: datetime, seconds: int
) -> Lease | None:
    """Take the lease in a short transaction of its own, or mark the conversation dirty for its
    holder and return None. Raises ``NotFoundError`` for an unknown conversation."""
    exists = select(CONVERSATIONS.c.id).where(CONVERSATIONS.c.id == conversation_id)
    for _ in range(ACQUIRE_TRIES):
        with session_scope(engine) as session:
            connection = session.connection()
            held = take(connection, conversation_id, owner=owner, now=now, seconds=seconds)
            if held is not None:
                return held
            if connection.execute(exists).first() is None:
                raise NotFoundError(f"unknown conversation {conversation_id!r}")
            if mark_dirty(connection, conversation_id, now):
                return None
    return None


def release_on(connection: Connection, lease: Lease, *, force: bool = False, **values: Any) -> str:
    """Let go unless the conversation turned dirty meanwhile, setting ``values`` on the row too.

    Returns ``"released"``, ``"dirty"`` (the lease is kept and ``dirty`` cleared: re-check, then
    release again) or ``"lost"`` (the lease expired and someone else took it). ``force`` lets go
    even when dirty, leaving the flag for the reconcile pass.
    """
    c = CONVERSATIONS.c
    mine = and_(c.id == lease.conversation_id, c.lease_owner == lease.owner)
    condition = mine if force else and_(mine, c.dirty.is_(False))
    freed = connection.execute(
        update(CONVERSATIONS)
        .where(condition)
        .values(lease_owner=None, lease_expires_at=None, **values)
    ).rowcount
    if freed == 1:
        return "released"
    kept = connection.execute(
        update(CONVERSATIONS).where(mine).values(dirty=False, **values)
    ).rowcount
    return "dirty" if kept == 1 else "lost"


def release(engine: Engine, lease: Lease, *, force: bool = False) -> str:
    """``release_on`` in a short transaction of its own."""
    with session_scope(engine) as session:
        return release_on(session.connection(), lease, force=force)


def is_free(engine: Engine, conversation_id: str, now: datetime) -> bool:
    """Whether nobody holds a live lease on the conversation (one short read)."""
    c = CONVERSATIONS.c
    statement = select(c.lease_owner, c.lease_expires_at).where(c.id == conversation_id)
    with session_scope(engine) as session:
        row = session.connection().execute(statement).first()
    if row is None or row[0] is None:
        return True
    expires = row[1]
    if expires is not None and expires.tzinfo is None:
        expires = expires.replace(tzinfo=now.tzinfo)
    return expires is None or expires < now
