"""Pinned messages: stored, counted, and read for the request and the decision.

A pin is one row per message (``core.storage.models.Pin``). ``pin`` and ``unpin`` run in one
short write transaction under the conversation's lock (the exclusive one, so two pins cannot
both pass the cap); ``pin`` refuses a message the conversation does not hold (one
``NotFoundError``, whether the id is unknown or another conversation's) and a pin that would put
the conversation's pinned tokens (stored counts, all branches together) over
``RECAP_MAX_PINNED_TOKENS`` (``PinLimitError``, nothing written). The request path reads the
pinned ids of a conversation with one indexed query (``load_pins``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from recap.core.errors import NotFoundError, PinLimitError
from recap.core.results import PinResult
from recap.core.storage import store
from recap.core.storage.db import session_scope
from recap.core.storage.models import MESSAGES, PINS, utcnow

P, M = PINS.c, MESSAGES.c
_PINS_OF = select(P.message_id).where(P.conversation_id == bindparam("conversation_id"))
_PINNED_TOKENS = (
    select(func.coalesce(func.sum(M.tokens), 0))
    .select_from(PINS.join(MESSAGES, M.id == P.message_id))
    .where(P.conversation_id == bindparam("conversation_id"))
)


def load_pins(
    connection: Connection, conversation_id: str, as_of: datetime | None = None
) -> frozenset[int]:
    """The ids of the conversation's pinned messages (only those pinned at or before ``as_of``
    when given: a pin removed since is not known any more)."""
    statement = _PINS_OF
    if as_of is not None:
        statement = statement.where(P.created_at <= as_of)
    rows = connection.execute(statement, {"conversation_id": conversation_id})
    return frozenset(int(row[0]) for row in rows)


def pinned_tokens(connection: Connection, conversation_id: str) -> int:
    """Stored tokens of every pinned message of the conversation (all branches)."""
    params = {"conversation_id": conversation_id}
    return int(connection.execute(_PINNED_TOKENS, params).scalar() or 0)


def pinned_tokens_up_to(
    connection: Connection, conversation_id: str, cutoff: int, root: int = 0
) -> int:
    """Stored tokens of the pinned messages after ``root`` and at or before message ``cutoff``
    (all branches): what a summary up to it leaves to be sent after it, at most."""
    statement = _PINNED_TOKENS.where(P.message_id <= cutoff, P.message_id > root)
    params = {"conversation_id": conversation_id}
    return int(connection.execute(statement, params).scalar() or 0)


def _insert(connection: Connection) -> object:
    name = connection.dialect.name
    if name == "postgresql":
        return postgresql.insert(PINS)
    if name == "sqlite":
        return sqlite.insert(PINS)
    raise NotImplementedError(f"pins need SQLite or PostgreSQL, not {name}")


def _message_tokens(connection: Connection, conversation_id: str, message_id: int) -> int:
    statement = select(M.tokens).where(M.conversation_id == conversation_id, M.id == message_id)
    found = connection.execute(statement).first()
    if found is None:
        raise NotFoundError(f"message {message_id} is not in conversation {conversation_id!r}")
    return int(found[0])


def pin(
    engine: Engine,
    conversation_id: str,
    message_id: int,
    *,
    max_tokens: int,
    now: datetime | None = None,
) -> PinResult:
    """Pin one message of the conversation (already pinned: nothing changes)."""
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, exclusive=True):
            raise NotFoundError(f"unknown conversation {conversation_id!r}")
        connection = session.connection()
        size = _message_tokens(connection, conversation_id, message_id)
        pinned = load_pins(connection, conversation_id)
        total = pinned_tokens(connection, conversation_id)
        if message_id in pinned:
            return PinResult(
                conversation_id=conversation_id,
                message_id=message_id,
                pinned=True,
                changed=False,
                pinned_tokens=total,
                max_pinned_tokens=max_tokens,
            )
        if total + size > max_tokens:
            raise PinLimitError(
                f"pinning message {message_id} ({size} tokens) would put the pinned messages of "
                f"conversation {conversation_id!r} at {total + size} tokens, over "
                f"RECAP_MAX_PINNED_TOKENS ({max_tokens}); unpin another message or raise the "
                "setting"
            )
        statement = (
            _insert(connection)  # type: ignore[attr-defined]
            .values(
                conversation_id=conversation_id,
                message_id=message_id,
                created_at=now or utcnow(),
            )
            .on_conflict_do_nothing(index_elements=["message_id"])
        )
        connection.execute(statement)
        return PinResult(
            conversation_id=conversation_id,
            message_id=message_id,
            pinned=True,
            changed=True,
            pinned_tokens=total + size,
            max_pinned_tokens=max_tokens,
        )


def unpin(engine: Engine, conversation_id: str, message_id: int, *, max_tokens: int) -> PinResult:
    """Unpin one message of the conversation (not pinned: nothing changes)."""
    with session_scope(engine) as session:
        if not store.lock_conversation(session, conversation_id, exclusive=True):
            raise NotFoundError(f"unknown conversation {conversation_id!r}")
        connection = session.connection()
        _message_tokens(connection, conversation_id, message_id)
        statement = delete(PINS).where(
            P.conversation_id == conversation_id, P.message_id == message_id
        )
        changed = bool(connection.execute(statement).rowcount)
        total = pinned_tokens(connection, conversation_id)
        return PinResult(
            conversation_id=conversation_id,
            message_id=message_id,
            pinned=False,
            changed=changed,
            pinned_tokens=total,
            max_pinned_tokens=max_tokens,
        )
