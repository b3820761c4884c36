"""Every read and write of a user's memory: the entries, the user's switch, and the one short
write of an extraction (its edits, its turn marked done, its compaction-log row).

Entries are keyed per user (``uq_memories_user_key``); a write of a user's entries first takes
the user's row of ``memory_users`` (inserted if missing, then locked), so two writers of one user
check the token cap one after the other on PostgreSQL as on SQLite (whose writes are serialized
anyway). An entry remembers the conversation and message that last wrote it: erasing that
conversation (``core.storage.erase``, every table with a ``conversation_id``) erases it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql, sqlite

from recap.core.counting import tokens
from recap.core.errors import InputError
from recap.core.storage import store
from recap.core.storage.compaction_log import record_run
from recap.core.storage.db import session_scope, write_scope
from recap.core.storage.models import MEMORIES, MEMORY_RUNS, MEMORY_USERS, utcnow
from recap.core.values.memory import (
    DELETE,
    MEMORY_ENCODING,
    MemoryEdit,
    MemoryRec,
    check_key,
    check_text,
    check_user,
)

M, R, U = MEMORIES.c, MEMORY_RUNS.c, MEMORY_USERS.c


class MemoryLimitError(InputError):
    """A set would take the user's memory past its token cap (``RECAP_MEMORY_MAX_TOKENS``)."""


def entry_tokens(key: str, text: str) -> int:
    """What an entry costs against the cap: its line as injected (``- key: text``)."""
    return tokens.count_text(f"- {key}: {text}", MEMORY_ENCODING)


def _rec(row: Any) -> MemoryRec:
    return MemoryRec(
        key=row.key,
        text=row.text,
        tokens=int(row.tokens),
        uses=int(row.uses),
        created_at=store.as_utc(row.created_at),
        updated_at=store.as_utc(row.updated_at),
        conversation_id=row.conversation_id,
        message_id=row.message_id,
    )


_ENTRIES = select(
    M.key,
    M.text,
    M.tokens,
    M.uses,
    M.created_at,
    M.updated_at,
    M.conversation_id,
    M.message_id,
)


def load(connection: Connection, user_id: str) -> list[MemoryRec]:
    """The user's entries, newest first (one indexed read)."""
    statement = _ENTRIES.where(M.user_id == user_id).order_by(M.updated_at.desc(), M.key)
    return [_rec(row) for row in connection.execute(statement)]


def enabled(connection: Connection, user_id: str) -> bool:
    """The user's own switch (on unless they turned memory off)."""
    value = connection.execute(select(U.enabled).where(U.user_id == user_id)).scalar()
    return value is None or bool(value)


# The request path: one query, in rank order (``core.request.memory.ranked``), no dates parsed;
# plain SQL, whose cache key costs nothing to make (a select with a subquery cost more than the
# query itself).
_FOR_REQUEST = sql_text(
    "SELECT key, text, tokens, uses FROM memories WHERE user_id = :user_id AND NOT EXISTS "
    "(SELECT 1 FROM memory_users WHERE memory_users.user_id = :user_id "
    "AND NOT memory_users.enabled) ORDER BY uses DESC, updated_at DESC, key"
)


def for_request(connection: Connection, user_id: str) -> list[MemoryRec]:
    """What a request of the user may send, in rank order (the most written first, then the
    newest): their entries, none when they turned memory off. One query."""
    rows = connection.execute(_FOR_REQUEST, {"user_id": user_id})
    return [MemoryRec(key=k, text=t, tokens=int(n), uses=int(u)) for k, t, n, u in rows]


def list_memories(engine: Engine, user_id: str) -> list[MemoryRec]:
    with session_scope(engine) as session:
        return load(session.connection(), check_user(user_id))


def is_enabled(engine: Engine, user_id: str) -> bool:
    with session_scope(engine) as session:
        return enabled(session.connection(), check_user(user_id))


def _insert(connection: Connection) -> Any:
    return postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert


def _lock_user(connection: Connection, user_id: str, now: datetime) -> bool:
    """Take the user's row (created on first use) for the rest of the transaction; their
    switch."""
    insert = _insert(connection)
    connection.execute(
        insert(MEMORY_USERS)
        .values(user_id=user_id, enabled=True, updated_at=now)
        .on_conflict_do_nothing(index_elements=["user_id"])
    )
    row = connection.execute(
        select(U.enabled).where(U.user_id == user_id).with_for_update()
    ).scalar()
    return bool(row)


def set_enabled(engine: Engine, user_id: str, on: bool) -> bool:
    """Turn the user's memory on or off; what it is now."""
    user_id = check_user(user_id)
    now = utcnow()
    with write_scope(engine) as session:
        connection = session.connection()
        _lock_user(connection, user_id, now)
        connection.execute(
            update(MEMORY_USERS).where(U.user_id == user_id).values(enabled=on, updated_at=now)
        )
    return on


def _used(connection: Connection, user_id: str, but: str) -> int:
    statement = select(func.coalesce(func.sum(M.tokens), 0)).where(
        M.user_id == user_id, M.key != but
    )
    return int(connection.execute(statement).scalar_one())


def _put(
    connection: Connection,
    user_id: str,
    key: str,
    text: str,
    cap: int,
    now: datetime,
    source: tuple[str | None, int | None] = (None, None),
) -> MemoryRec:
    """Insert or update one entry within the cap (the caller holds the user's row)."""
    cost = entry_tokens(key, text)
    used = _used(connection, user_id, key)
    if used + cost > cap:
        raise MemoryLimitError(
            f"memory {key!r} ({cost} tokens) would take user {user_id!r} past the cap of "
            f"{cap} tokens ({used} used by the other entries; RECAP_MEMORY_MAX_TOKENS)"
        )
    conversation_id, message_id = source
    values = {
        "user_id": user_id,
        "key": key,
        "text": text,
        "tokens": cost,
        "uses": 1,
        "conversation_id": conversation_id,
        "message_id": message_id,
        "created_at": now,
        "updated_at": now,
    }
    insert = _insert(connection)
    changed = {
        "text": text,
        "tokens": cost,
        "uses": M.uses + 1,
        "conversation_id": conversation_id,
        "message_id": message_id,
        "updated_at": now,
    }
    connection.execute(
        insert(MEMORIES)
        .values(values)
        .on_conflict_do_update(index_elements=["user_id", "key"], set_=changed)
    )
    row = connection.execute(_ENTRIES.where(M.user_id == user_id, M.key == key)).one()
    return _rec(row)


def set_memory(engine: Engine, user_id: str, key: str, text: str, *, cap: int) -> MemoryRec:
    """Set one entry by hand (the CLI, the Python API); ``MemoryLimitError`` past the cap,
    nothing written."""
    user_id, key, text = check_user(user_id), check_key(key), check_text(text)
    now = utcnow()
    with write_scope(engine) as session:
        connection = session.connection()
        _lock_user(connection, user_id, now)
        return _put(connection, user_id, key, text, cap, now)


def delete_memory(engine: Engine, user_id: str, key: str | None = None) -> int:
    """Delete one entry (or, with no key, all of the user's entries and their switch); how
    many entries went."""
    user_id = check_user(user_id)
    with write_scope(engine) as session:
        connection = session.connection()
        statement = delete(MEMORIES).where(M.user_id == user_id)
        if key is not None:
            statement = statement.where(M.key == check_key(key))
        gone = int(connection.execute(statement).rowcount or 0)
        if key is None:
            connection.execute(delete(MEMORY_RUNS).where(R.user_id == user_id))
            connection.execute(delete(MEMORY_USERS).where(U.user_id == user_id))
        return gone


def users(engine: Engine, *, prefix: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The users with entries (the console): their id, entries and tokens."""
    statement = (
        select(M.user_id, func.count(), func.sum(M.tokens), func.max(M.updated_at))
        .group_by(M.user_id)
        .order_by(func.max(M.updated_at).desc())
        .limit(limit)
    )
    if prefix:
        statement = statement.where(M.user_id.startswith(prefix, autoescape=True))
    with session_scope(engine) as session:
        rows = session.connection().execute(statement).all()
    return [
        {"user_id": r[0], "memories": int(r[1]), "tokens": int(r[2] or 0), "updated_at": r[3]}
        for r in rows
    ]


@dataclass(slots=True)
class Written:
    """What an extraction's write did: edits applied and refused (past the cap, or a delete
    of a key not stored), or nothing at all because the turn was done already or the
    conversation is gone (``done``)."""

    applied: list[MemoryEdit] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    done: str | None = None  # why nothing was written


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtractionWrite:
    """One extraction's result, to write in one short transaction."""

    user_id: str
    conversation: store.Identity
    message_id: int
    edits: Sequence[MemoryEdit]
    cap: int
    task_id: str | None = None
    log: dict[str, Any] | None = None  # its compaction-log row's columns, when logged


def write_extraction(engine: Engine, run: ExtractionWrite) -> Written:
    """Apply an extraction's edits, mark its turn done and log it, all in one transaction
    that holds the conversation's lock (nothing is written for a conversation deleted, or
    created again, since it was read), or nothing when the turn was done already (a
    redelivered task) or the user turned memory off meanwhile."""
    written = Written()
    now = utcnow()
    conversation = run.conversation
    with write_scope(engine) as session:
        if not store.lock_conversation(
            session, conversation.id, incarnation=conversation.incarnation
        ):
            written.done = "the conversation was deleted"
            return written
        connection = session.connection()
        if not _lock_user(connection, run.user_id, now):
            written.done = "the user turned memory off"
            return written
        insert = _insert(connection)
        marked = connection.execute(
            insert(MEMORY_RUNS)
            .values(
                user_id=run.user_id,
                conversation_id=conversation.id,
                message_id=run.message_id,
                task_id=run.task_id,
                edits=0,
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=["user_id", "conversation_id", "message_id"])
            .returning(R.id)
        ).first()
        if marked is None:
            written.done = "this turn's memories were extracted already"
            return written
        for edit in run.edits:
            if edit.op == DELETE:
                statement = delete(MEMORIES).where(M.user_id == run.user_id, M.key == edit.key)
                if connection.execute(statement).rowcount:
                    written.applied.append(edit)
                else:
                    written.refused.append(f"{edit.key}: not stored")
                continue
            source = (conversation.id, run.message_id)
            try:
                _put(connection, run.user_id, edit.key, edit.text, run.cap, now, source)
            except MemoryLimitError as exc:
                written.refused.append(str(exc))
            else:
                written.applied.append(edit)
        connection.execute(
            update(MEMORY_RUNS)
            .where(
                R.user_id == run.user_id,
                R.conversation_id == conversation.id,
                R.message_id == run.message_id,
            )
            .values(edits=len(written.applied))
        )
        if run.log is not None:
            record_run(connection, {**run.log, "created_at": now})
    return written


def written_by(engine: Engine, user_id: str) -> list[dict[str, Any]]:
    """The turns whose extraction wrote to the user's memory, newest first (the console)."""
    statement = (
        select(R.conversation_id, R.message_id, R.edits, R.created_at)
        .where(R.user_id == check_user(user_id))
        .order_by(R.id.desc())
        .limit(100)
    )
    with session_scope(engine) as session:
        rows = session.connection().execute(statement).all()
    return [
        {"conversation_id": r[0], "message_id": r[1], "edits": int(r[2]), "created_at": r[3]}
        for r in rows
    ]


def log_failure(engine: Engine, values: dict[str, Any]) -> None:
    """A failed extraction's compaction-log row (its conversation still stored)."""
    with write_scope(engine) as session:
        if store.lock_conversation(session, values["conversation_id"]):
            record_run(session.connection(), {**values, "created_at": utcnow()})


def turn_done(connection: Connection, user_id: str, conversation_id: str, message_id: int) -> bool:
    """Whether an extraction of this turn already wrote its result."""
    statement = select(R.id).where(
        R.user_id == user_id, R.conversation_id == conversation_id, R.message_id == message_id
    )
    return connection.execute(statement).first() is not None
