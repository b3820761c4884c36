"""Reading and writing conversations. Each function takes a short-lived ``Session``; the callers
own the transaction, so an import is all-or-nothing."""

from __future__ import annotations

import hmac
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Connection, Engine, TextClause, bindparam, func, insert, text, update
from sqlalchemy import select as sa_select
from sqlmodel import Session

from recap.core.counting import tokens
from recap.core.errors import InputError, NotFoundError
from recap.core.request.validate import (
    DERIVED_PREFIX,
    KNOWN_KEYS,
    Step,
    calls_needed,
    check_message,
    check_record,
    check_tool_pairing,
    open_calls_from_tail,
)
from recap.core.storage.db import begin_write
from recap.core.storage.hashing import message_hash
from recap.core.storage.models import (
    CONVERSATIONS,
    MESSAGES,
    Conversation,
    new_incarnation,
    utcnow,
)
from recap.core.values import limits
from recap.core.values.limits import MESSAGE_ID_MAX as MAX_ID
from recap.core.values.records import Msg

MESSAGE_COLUMNS = tuple(
    MESSAGES.c[name]
    for name in (
        "id",
        "parent_id",
        "role",
        "content",
        "tokens",
        "tool_calls",
        "tool_call_id",
        "name",
        "content_parts",
        "extra",
        "output_path",
        "original_bytes",
    )
)


class Prepared(NamedTuple):
    """A message as it is stored, and what Recap derived from it on the way in (never taken from
    the message itself: the columns ``output_path`` and ``original_bytes`` come only from here)."""

    message: dict[str, Any]
    output_path: str | None = None  # the saved full output, when ingest cut the message
    original_bytes: int | None = None  # the saved file's size, the most ``export --full`` reads


class Preparer(Protocol):
    """The ingest step (``core.storage.outputs.Ingest``): a checked message in, what to store
    out."""

    def prepare(self, message: dict[str, Any]) -> Prepared: ...


def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything Recap stores is UTC."""
    if moment is not None and moment.tzinfo is None:
        from datetime import UTC

        return moment.replace(tzinfo=UTC)
    return moment


def row_values(
    message: Mapping[str, Any],
    encoding: str,
    *,
    source: Mapping[str, Any] | None = None,
    model: str | None = None,
    output_path: str | None = None,
    original_bytes: int | None = None,
) -> dict[str, Any]:
    """The column values of a validated OpenAI-format message, its tokens counted once; the
    content hash is of ``source``, the message as it arrived before ingest (default: itself).
    The derived columns come from the arguments only: no key of the message reaches them, and a
    ``_``-key (refused on input) is never stored."""
    content = message.get("content")
    extra = {
        k: v for k, v in message.items() if k not in KNOWN_KEYS and not k.startswith(DERIVED_PREFIX)
    }
    return {
        "role": message["role"],
        "content": content if isinstance(content, str) or content is None else None,
        "content_parts": content if isinstance(content, list) else None,
        "tool_calls": message.get("tool_calls") or None,
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
        "extra": extra or None,
        "tokens": tokens.count_message(message, encoding, model=model),
        "encoding": tokens.count_basis(message, encoding, model=model),
        "output_path": output_path,
        "original_bytes": original_bytes,
        "content_hash": message_hash(message if source is None else source),
    }


def prepared_values(
    message: dict[str, Any], model: str, prepare: Preparer | None = None
) -> dict[str, Any]:
    """The column values of a checked message after the ingest step (when there is one)."""
    stored = prepare.prepare(message) if prepare is not None else Prepared(message)
    return row_values(
        stored.message,
        tokens.encoding_name_for(model),
        source=message,
        model=model,
        output_path=stored.output_path,
        original_bytes=stored.original_bytes,
    )


def is_owner(stored: str | None, fingerprint: str) -> bool:
    """Whether a conversation's stored owner is ``fingerprint`` (compared in constant time; a
    conversation without an owner is nobody's)."""
    return stored is not None and hmac.compare_digest(stored, fingerprint)


def owned_by(connection: Connection, conversation_id: str, fingerprint: str) -> bool:
    """Whether the conversation exists and belongs to ``fingerprint``."""
    statement = sa_select(_c.owner).where(_c.id == conversation_id)
    return is_owner(connection.execute(statement).scalar(), fingerprint)


def get_conversation(session: Session, conversation_id: str) -> Conversation:
    """The conversation row, or a ``NotFoundError`` naming the id."""
    conversation = session.get(Conversation, conversation_id)
    if conversation is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return conversation


def create_conversation(
    session: Session,
    conversation_id: str | None,
    model: str,
    max_input_tokens: int | None = None,
    meta: dict[str, Any] | None = None,
) -> Conversation:
    """A new conversation (a UUID when no id is given); an existing id is an ``InputError``,
    also when another process or thread creates it at the same moment (an insert that does
    nothing on the key, never a unique-key error)."""
    cid = conversation_id or str(uuid.uuid4())
    limits.check_conversation(cid, model, max_input_tokens)
    tokens.context_window(model, max_input_tokens)  # an unknown model fails before any write
    begin_write(session)
    if not _insert_conversation(session, cid, model, max_input_tokens, meta=meta or None):
        raise InputError(f"conversation {cid!r} already exists")
    return get_conversation(session, cid)


def ensure_conversation(
    session: Session,
    conversation_id: str,
    model: str,
    max_input_tokens: int | None = None,
    *,
    owner: str | None = None,
) -> tuple[Conversation, bool]:
    """The conversation, created when it does not exist yet, and whether this call created it.

    Insert-or-get under the primary key (``INSERT ... ON CONFLICT (id) DO NOTHING``, then a
    read): processes creating one conversation at once all get the one row, whichever inserted
    it, and none sees "already exists". On PostgreSQL an insert that meets another transaction's
    uncommitted row waits for it and then does nothing. A row that existed keeps its model,
    window and owner (the caller checks the owner)."""
    limits.check_conversation(conversation_id, model, max_input_tokens)
    tokens.context_window(model, max_input_tokens)  # an unknown model fails before any write
    begin_write(session)
    created = _insert_conversation(session, conversation_id, model, max_input_tokens, owner=owner)
    conversation = session.get(Conversation, conversation_id, populate_existing=True)
    if conversation is None:  # deleted again between the insert and the read
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return conversation, created


def _insert_conversation(
    session: Session,
    conversation_id: str,
    model: str,
    max_input_tokens: int | None,
    *,
    meta: dict[str, Any] | None = None,
    owner: str | None = None,
) -> bool:
    """Insert the conversation's row with a new incarnation unless its id is stored; whether
    this call inserted it."""
    now = utcnow()
    values: dict[str, Any] = {
        "id": conversation_id,
        "model": model,
        "max_input_tokens": max_input_tokens,
        "created_at": now,
        "last_activity_at": now,
        "dirty": False,
        "owner": owner,
        "incarnation": new_incarnation(),
    }
    if meta:  # else SQL NULL (a JSON column would store the text null)
        values["meta"] = meta
    statement = _insert_or_nothing(session).values(**values).returning(CONVERSATIONS.c.id)
    return session.connection().execute(statement).first() is not None


def _insert_or_nothing(session: Session) -> Any:
    """An insert into conversations that does nothing when the id exists, in the dialect's
    own words."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(CONVERSATIONS).on_conflict_do_nothing(index_elements=["id"])
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(CONVERSATIONS).on_conflict_do_nothing(index_elements=["id"])


_INSERT_MESSAGE = insert(MESSAGES).returning(MESSAGES.c.id)
_TOUCH = (
    update(CONVERSATIONS)
    .where(CONVERSATIONS.c.id == bindparam("conversation_id"))
    .values(last_activity_at=bindparam("now"))
)


def insert_chain(
    session: Session,
    conversation_id: str,
    rows: Sequence[dict[str, Any]],
    parent_id: int | None,
    *,
    touch: bool = True,
) -> list[int]:
    """Insert rows as a chain under ``parent_id``; returns their ids in order. The
    conversation's activity is touched unless the caller's transaction did already
    (``touch=False``)."""
    connection = session.connection()
    ids: list[int] = []
    now = utcnow()
    for values in rows:
        params = {**values, "conversation_id": conversation_id, "parent_id": parent_id}
        parent_id = int(connection.execute(_INSERT_MESSAGE, {**params, "created_at": now}).one()[0])
        ids.append(parent_id)
    if touch:
        connection.execute(_TOUCH, {"conversation_id": conversation_id, "now": now})
    return ids


def import_records(
    session: Session,
    records: Sequence[Mapping[str, Any]],
    *,
    default_model: str,
    model: str | None = None,
    max_input_tokens: int | None = None,
    prepare: Preparer | None = None,
) -> list[tuple[str, int]]:
    """Import validated records; the caller's transaction makes the whole file one unit.

    Every record is checked before anything is written or saved, so a bad record leaves no
    output file of the good ones before it either."""
    checked = [check_record(record, f"conversation {i + 1}") for i, record in enumerate(records)]
    seen: set[str] = set()
    result: list[tuple[str, int]] = []
    for index, (record, messages) in enumerate(zip(records, checked, strict=True)):
        cid = str(record["id"]) if record.get("id") is not None else None
        if cid is not None and cid in seen:
            raise InputError(f"conversation {index + 1}: duplicate id {cid!r} in the file")
        meta = {k: v for k, v in record.items() if k not in ("id", "messages")}
        conversation = create_conversation(
            session, cid, model or default_model, max_input_tokens, meta
        )
        seen.add(conversation.id)
        rows = [prepared_values(m, conversation.model, prepare) for m in messages]
        ids = insert_chain(session, conversation.id, rows, None)
        result.append((conversation.id, len(ids)))
    return result


# --- appends -----------------------------------------------------------------------------------
#
# An append without a parent goes after the branch head (the conversation's newest message),
# which only stays race-free while appends to one conversation run one at a time. So each append
# takes the conversation's lock first, in a short transaction of its own: on PostgreSQL a row
# lock on the conversation (FOR NO KEY UPDATE: it serializes appends and the lease's updates, and
# lets other rows' foreign-key checks through), on SQLite an immediate write transaction
# (BEGIN IMMEDIATE, emitted from SQLAlchemy's "begin" event for these transactions only).

# Messages of the branch read back from the head for the calls a result answers (a longer walk,
# then all of it, only when the shorter cannot tell): a result follows its call closely.
PAIRING_WINDOWS = (8, 256)

_c, _m = CONVERSATIONS.c, MESSAGES.c
# The lock is taken by a statement of its own: on PostgreSQL a statement that waited for a row
# lock still reads with the snapshot it started with, so the head is read by the next one.
_LOCK = (
    sa_select(_c.model).where(_c.id == bindparam("conversation_id")).with_for_update(key_share=True)
)
_MODEL_OF = sa_select(_c.model).where(_c.id == bindparam("conversation_id"))
_HEAD = sa_select(func.max(_m.id)).where(_m.conversation_id == bindparam("conversation_id"))
_PARENT_OF = sa_select(_m.id).where(
    _m.id == bindparam("parent_id"), _m.conversation_id == bindparam("conversation_id")
)
# The ids of an assistant message's tool calls, read in the database (the arguments stay there).
_CALL_IDS = {
    "sqlite": "CASE WHEN m.role = 'assistant' THEN (SELECT json_group_array(json_extract("
    "c.value, '$.id')) FROM json_each(m.tool_calls) AS c WHERE c.type = 'object') END",
    "postgresql": "CASE WHEN m.role = 'assistant' AND json_typeof(m.tool_calls) = 'array' THEN "
    "(SELECT json_agg(c.value ->> 'id') FROM json_array_elements(m.tool_calls) AS c) END",
}
# The branch from the leaf (default: the newest message) back, ``rows`` messages at most, each
# step a primary-key lookup of the parent: its cost follows the rows read, whatever the planner
# knows of the conversation (a range scan of it was planned as a scan of every row at times).
_WALK = """
WITH RECURSIVE up(id, parent_id, role, tool_call_id, call_ids, depth) AS (
    SELECT m.id, m.parent_id, m.role, m.tool_call_id, {calls}, 1
    FROM messages AS m
    WHERE m.id = (SELECT max(h.id) FROM messages AS h
                  WHERE h.conversation_id = :conversation_id AND h.id <= :leaf)
  UNION ALL
    SELECT m.id, m.parent_id, m.role, m.tool_call_id, {calls}, up.depth + 1
    FROM up JOIN messages AS m ON m.id = up.parent_id
    WHERE up.depth < :rows
)
SELECT id, parent_id, role, tool_call_id, call_ids FROM up ORDER BY depth
"""
_walks: dict[str, TextClause] = {}


def append_messages(
    session: Session,
    conversation_id: str,
    messages: Sequence[Any],
    parent_id: int | None = None,
    prepare: Preparer | None = None,
) -> list[int]:
    """Append ``messages`` as a chain after ``parent_id`` (default: the branch head), all or
    nothing, under the conversation's lock; returns their ids.

    Call it on a fresh session (the lock is taken as its transaction begins) and commit soon.
    Each tool result must answer an open call: one made earlier in ``messages``, or one on the
    branch that no result answered yet (counted per id, so reused ids pair turn after turn).
    """
    checked = [check_message(m, f"message {i}" if len(messages) > 1 else "message")
               for i, m in enumerate(messages)]  # fmt: skip
    if parent_id is not None and not 0 < parent_id <= MAX_ID:
        raise NotFoundError(f"message {parent_id} is not in conversation {conversation_id!r}")
    _warm_up(session, conversation_id)
    model = _lock_for_append(session, conversation_id, parent_id)
    needed = calls_needed(checked)
    if needed:  # the pairing read starts at the head too: one statement for both
        parent_id, open_calls = _open_calls(session, conversation_id, parent_id, needed)
        check_tool_pairing(checked, "", open_calls=open_calls)
    elif parent_id is None:
        parent_id = (
            session.connection().execute(_HEAD, {"conversation_id": conversation_id}).scalar()
        )
    rows = [prepared_values(m, model, prepare) for m in checked]
    return insert_chain(session, conversation_id, rows, parent_id)


WARMED_CONVERSATIONS = 4_096  # conversations whose model's counting is known loaded here
_warmed: OrderedDict[str, None] = OrderedDict()
_warmed_lock = threading.Lock()


def _warm_up(session: Session, conversation_id: str) -> None:
    """Before a process's first append to a conversation, load what counting its messages
    needs (the model's tokenizer, litellm's model map), reading its model on a connection of
    its own: never while holding the write lock, where a cold start under load kept the other
    writers waiting for seconds, past the busy timeout."""
    with _warmed_lock:
        if conversation_id in _warmed:
            _warmed.move_to_end(conversation_id)
            return
    bind = session.get_bind()
    if not isinstance(bind, Engine):
        return
    with bind.connect() as connection:
        model = connection.execute(_MODEL_OF, {"conversation_id": conversation_id}).scalar()
    if model is None:
        return  # the append says so, under its lock
    prepared_values({"role": "user", "content": "warm"}, str(model))
    with _warmed_lock:
        _warmed[conversation_id] = None
        while len(_warmed) > WARMED_CONVERSATIONS:
            _warmed.popitem(last=False)


def _lock_for_append(session: Session, conversation_id: str, parent_id: int | None) -> str:
    """Take the conversation's append lock; its model. An explicit parent must be one of its
    messages."""
    connection = begin_write(session)
    params = {"conversation_id": conversation_id, "parent_id": parent_id}
    model = connection.execute(_LOCK, params).scalar()
    if model is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    if parent_id is not None and connection.execute(_PARENT_OF, params).scalar() is None:
        raise NotFoundError(f"message {parent_id} is not in conversation {conversation_id!r}")
    return str(model)


class Identity(NamedTuple):
    """A conversation as a run or a request read it: its id, and its incarnation when known
    (None: whichever is stored under the id)."""

    id: str
    incarnation: str | None = None


def lock_conversation(
    session: Session,
    conversation_id: str,
    *,
    exclusive: bool = False,
    incarnation: str | None = None,
) -> bool:
    """Start the session's transaction as a write holding the conversation's lock, as an append
    does (SQLite: BEGIN IMMEDIATE; PostgreSQL: a row lock, ``FOR UPDATE`` when ``exclusive``, as a
    delete takes it, else ``FOR NO KEY UPDATE``, as an append takes it); whether the conversation
    is still there, and still the ``incarnation`` read earlier when one is given (a conversation
    deleted and created again under its id is another one). Call it first on a fresh session: a
    writer that must not write for a deleted conversation learns it here, and a delete waits for
    the writers already holding it."""
    connection = begin_write(session)
    statement = sa_select(_c.incarnation).where(_c.id == conversation_id)
    found = connection.execute(statement.with_for_update(key_share=not exclusive)).first()
    return found is not None and (incarnation is None or found[0] == incarnation)


def incarnation_of(connection: Connection, conversation_id: str) -> str | None:
    """The conversation's incarnation, or None when it is not stored."""
    statement = sa_select(_c.incarnation).where(_c.id == conversation_id)
    value = connection.execute(statement).scalar()
    return str(value) if value is not None else None


def touch_conversation(session: Session, conversation_id: str) -> tuple[str, str | None] | None:
    """Start the session's transaction as a write holding the conversation's lock by touching
    its last activity, as ``lock_conversation`` then an update would (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: the update's row lock, which a delete waits for and appends do not): its model
    and owner read back by the same statement, or None when it is not there."""
    params = {"conversation_id": conversation_id, "now": utcnow()}
    found = begin_write(session).execute(_TOUCH_READING, params).first()
    return (str(found[0]), found[1]) if found is not None else None


_TOUCH_READING = _TOUCH.returning(CONVERSATIONS.c.model, CONVERSATIONS.c.owner)


def _open_calls(
    session: Session, conversation_id: str, leaf: int | None, needed: Mapping[str, int]
) -> tuple[int | None, dict[str, int]]:
    """The leaf (default: the branch head) and the open calls of the ``needed`` ids on its
    branch: from its newest messages, and from the whole branch (ids, roles and call ids, never
    content) only when those cannot tell (a result whose call lies further back, or none)."""
    for rows in (*PAIRING_WINDOWS, MAX_ID):
        leaf, steps, reached_root = _walk_back(session, conversation_id, leaf, rows)
        found = open_calls_from_tail(steps, needed, reached_root=reached_root or rows == MAX_ID)
        if found is not None:
            return leaf, found
    raise AssertionError("a walk over every message always tells")  # pragma: no cover


def _walk_back(
    session: Session, conversation_id: str, leaf: int | None, rows: int
) -> tuple[int | None, Iterator[Step], bool]:
    """The leaf (default: the newest message), its branch back ``rows`` messages at most
    (newest first, call ids decoded as the walk gets to them), and whether that is the root."""
    connection = session.connection()
    dialect = connection.dialect.name
    statement = _walks.get(dialect)
    if statement is None:
        calls = _CALL_IDS.get(dialect, "m.tool_calls")  # elsewhere: the calls, ids taken here
        statement = _walks[dialect] = text(_WALK.format(calls=calls))
    params = {"conversation_id": conversation_id, "leaf": leaf or MAX_ID, "rows": rows}
    path = connection.execute(statement, params).all()
    if not path:
        return leaf, iter(()), True
    steps = (Step(str(role), call_id, _ids_of(calls)) for _, _, role, call_id, calls in path)
    return int(path[0][0]), steps, path[-1][1] is None


def _ids_of(value: Any) -> tuple[str, ...]:
    """Call ids from the walk's ``call_ids`` column (JSON text or decoded, ids or whole calls)."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list):
        return ()
    return tuple(str(v.get("id", "")) if isinstance(v, dict) else str(v) for v in value)


def to_msg(row: Any) -> Msg:
    """A row of ``MESSAGE_COLUMNS`` as a ``Msg``."""
    return Msg(
        id=int(row[0]),
        parent_id=row[1],
        role=row[2],
        content=row[3],
        tokens=int(row[4]),
        tool_calls=tuple(row[5] or ()),
        tool_call_id=row[6],
        name=row[7],
        content_parts=tuple(row[8]) if row[8] is not None else None,
        extra=row[9],
        output_path=row[10],
        original_bytes=row[11],
    )


# Built once: every request reads these, and building a statement costs more than running it.
