"""Reading and writing conversations. Each function takes a short-lived ``Session``; the callers
own the transaction, so an import is all-or-nothing."""

from __future__ import annotations

import hmac
import json
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Connection, Engine, TextClause, bindparam, event, func, insert, text, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

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
from recap.core.storage.hashing import message_hash
from recap.core.storage.models import (
    CLEARINGS,
    CONVERSATIONS,
    MESSAGES,
    SUMMARIES,
    Conversation,
    Usage,
    utcnow,
)
from recap.core.values import limits
from recap.core.values.actions import SETTLING, Action
from recap.core.values.limits import MESSAGE_ID_MAX as MAX_ID
from recap.core.values.records import ClearingRec, Msg, SummaryRec, merge_step

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
    """A new conversation (a UUID when no id is given); an existing id is an error."""
    cid = conversation_id or str(uuid.uuid4())
    limits.check_conversation(cid, model, max_input_tokens)
    if session.get(Conversation, cid) is not None:
        raise InputError(f"conversation {cid!r} already exists")
    tokens.context_window(model, max_input_tokens)  # an unknown model fails before any write
    now = utcnow()
    conversation = Conversation(
        id=cid,
        model=model,
        max_input_tokens=max_input_tokens,
        meta=meta or None,
        created_at=now,
        last_activity_at=now,
    )
    session.add(conversation)
    session.flush()
    return conversation


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
    now = utcnow()
    values = {
        "id": conversation_id,
        "model": model,
        "max_input_tokens": max_input_tokens,
        "created_at": now,
        "last_activity_at": now,
        "dirty": False,
        "owner": owner,
    }
    statement = _insert_or_nothing(session).values(**values).returning(CONVERSATIONS.c.id)
    created = session.connection().execute(statement).first() is not None
    conversation = session.get(Conversation, conversation_id, populate_existing=True)
    if conversation is None:  # deleted again between the insert and the read
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return conversation, created


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

APPEND_OPTION = "recap_append"  # execution option marking an append's transaction
# Messages of the branch read back from the head for the calls a result answers (a longer walk,
# then all of it, only when the shorter cannot tell): a result follows its call closely.
PAIRING_WINDOWS = (8, 256)
_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()  # SQLite engines with the hook
_hook_lock = threading.Lock()

_c, _m = CONVERSATIONS.c, MESSAGES.c
# The lock is taken by a statement of its own: on PostgreSQL a statement that waited for a row
# lock still reads with the snapshot it started with, so the head is read by the next one.
_LOCK = (
    sa_select(_c.model).where(_c.id == bindparam("conversation_id")).with_for_update(key_share=True)
)
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


def _begin_immediate(connection: Connection) -> None:
    """SQLAlchemy's recipe for pysqlite, scoped to appends: their transaction starts as a write
    transaction, so the head read and the insert after it are one serialized unit."""
    if connection.get_execution_options().get(APPEND_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _hook(engine: Engine) -> None:
    """Attach the BEGIN IMMEDIATE hook to a SQLite engine, once."""
    if engine.dialect.name != "sqlite" or engine in _hooked:
        return
    with _hook_lock:
        if not event.contains(engine, "begin", _begin_immediate):
            event.listen(engine, "begin", _begin_immediate)
        _hooked.add(engine)


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


def _lock_for_append(session: Session, conversation_id: str, parent_id: int | None) -> str:
    """Take the conversation's append lock; its model. An explicit parent must be one of its
    messages."""
    bind = session.get_bind()
    if isinstance(bind, Engine):
        _hook(bind)
    connection = session.connection(execution_options={APPEND_OPTION: True})
    params = {"conversation_id": conversation_id, "parent_id": parent_id}
    model = connection.execute(_LOCK, params).scalar()
    if model is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    if parent_id is not None and connection.execute(_PARENT_OF, params).scalar() is None:
        raise NotFoundError(f"message {parent_id} is not in conversation {conversation_id!r}")
    return str(model)


def lock_conversation(session: Session, conversation_id: str, *, exclusive: bool = False) -> bool:
    """Start the session's transaction as a write holding the conversation's lock, as an append
    does (SQLite: BEGIN IMMEDIATE; PostgreSQL: a row lock, ``FOR UPDATE`` when ``exclusive``, as a
    delete takes it, else ``FOR KEY SHARE``, as an append takes it); whether the conversation is
    still there. Call it first on a fresh session: a writer that must not write for a deleted
    conversation learns it here, and a delete waits for the writers already holding it."""
    connection = _append_connection(session)
    statement = sa_select(_c.id).where(_c.id == conversation_id)
    statement = statement.with_for_update(key_share=not exclusive)
    return connection.execute(statement).first() is not None


def touch_conversation(session: Session, conversation_id: str) -> tuple[str, str | None] | None:
    """Start the session's transaction as a write holding the conversation's lock by touching
    its last activity, as ``lock_conversation`` then an update would (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: the update's row lock, which a delete waits for and appends do not): its model
    and owner read back by the same statement, or None when it is not there."""
    params = {"conversation_id": conversation_id, "now": utcnow()}
    found = _append_connection(session).execute(_TOUCH_READING, params).first()
    return (str(found[0]), found[1]) if found is not None else None


_TOUCH_READING = _TOUCH.returning(CONVERSATIONS.c.model, CONVERSATIONS.c.owner)


def _append_connection(session: Session) -> Connection:
    """The session's connection, its transaction begun as an append's (on SQLite, BEGIN
    IMMEDIATE: the write lock taken before the first read)."""
    bind = session.get_bind()
    if isinstance(bind, Engine):
        _hook(bind)
    return session.connection(execution_options={APPEND_OPTION: True})


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
_SUMMARIES_OF = (
    sa_select(
        SUMMARIES.c.id,
        SUMMARIES.c.cutoff_message_id,
        SUMMARIES.c.previous_summary_id,
        SUMMARIES.c.text,
        SUMMARIES.c.tokens,
        SUMMARIES.c.model,
        SUMMARIES.c.identifier_retention,
        SUMMARIES.c.created_at,
    )
    .where(SUMMARIES.c.conversation_id == bindparam("conversation_id"))
    .order_by(SUMMARIES.c.id)
)
_CLEARINGS_OF = (
    sa_select(
        CLEARINGS.c.message_id,
        CLEARINGS.c.reason,
        CLEARINGS.c.tokens_reclaimed,
        CLEARINGS.c.stage,
        CLEARINGS.c.kept_chars,
    )
    .where(CLEARINGS.c.conversation_id == bindparam("conversation_id"))
    .order_by(CLEARINGS.c.id)
)


def load_summaries(
    session: Session, conversation_id: str, before: datetime | None = None
) -> list[SummaryRec]:
    """The conversation's summaries, oldest first (only those recorded at or before ``before``
    when given: the request as it was then)."""
    statement = _SUMMARIES_OF
    if before is not None:
        statement = statement.where(SUMMARIES.c.created_at <= before)
    rows = session.connection().execute(statement, {"conversation_id": conversation_id})
    return [
        SummaryRec(
            id=int(row[0]),
            cutoff_message_id=int(row[1]),
            previous_summary_id=row[2],
            text=row[3],
            tokens=int(row[4]),
            model=row[5],
            identifier_retention=float(row[6]),
            created_at=as_utc(row[7]),
        )
        for row in rows
    ]


def load_clearings(
    session: Session, conversation_id: str, before: datetime | None = None
) -> dict[int, ClearingRec]:
    """How each recorded message of the conversation renders, by message id: its steps (aged,
    cleared, shortened arguments...) merged by ``core.values.records.merge_step``; only the
    steps recorded at or before ``before`` when given."""
    statement = _CLEARINGS_OF
    if before is not None:
        statement = statement.where(CLEARINGS.c.created_at <= before)
    rows = session.connection().execute(statement, {"conversation_id": conversation_id})
    found: dict[int, ClearingRec] = {}
    for message_id, reason, reclaimed, stage, chars in rows:
        mid = int(message_id)
        found[mid] = merge_step(found.get(mid), mid, reason, int(reclaimed), stage, chars)
    return found


def record_usage(
    session: Session,
    conversation_id: str,
    *,
    estimated_tokens: int,
    prompt_tokens: int,
    completion_tokens: int = 0,
    cached_tokens: int = 0,
    leaf_message_id: int | None = None,
) -> int:
    """Store what the provider reported for a request, beside Recap's estimate of it."""
    get_conversation(session, conversation_id)
    if prompt_tokens < 0 or completion_tokens < 0 or cached_tokens < 0 or estimated_tokens < 0:
        raise InputError("token counts must not be negative")
    row = Usage(
        conversation_id=conversation_id,
        leaf_message_id=leaf_message_id,
        estimated_tokens=estimated_tokens,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return int(row.id or 0)


def latest_usage(session: Session, conversation_id: str) -> Usage | None:
    """The most recent provider reading of the conversation, if any."""
    statement = (
        select(Usage)
        .where(Usage.conversation_id == conversation_id)
        .order_by(col(Usage.id).desc())
        .limit(1)
    )
    return session.exec(statement).first()


# --- failed runs -------------------------------------------------------------------------------

FAILED_RUNS_LIMIT = 1_000  # one screen of an operator's list; more means a wider outage to fix
# Runs after a failure that settle it: the conversation was brought under its trigger since.
SETTLING_ACTIONS = SETTLING


@dataclass(frozen=True)
class FailedRun:
    """The latest failed compression run of a conversation, as an operator lists it."""

    conversation_id: str
    at: datetime
    reason: str
    attempts: int  # model attempts of that run's task: its retries plus the last one
    task_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "at": self.at.isoformat(),
            "reason": self.reason,
            "attempts": self.attempts,
            "task_id": self.task_id,
        }


def failed_runs(
    session: Session,
    *,
    since: datetime,
    conversation_ids: Sequence[str] | None = None,
    limit: int = FAILED_RUNS_LIMIT,
) -> list[FailedRun]:
    """Conversations whose latest failed run is at or after ``since`` and that no later run
    summarized or cleared: that run of each, newest first."""
    from recap.core.storage.models import CompactionLog, table_of

    log = table_of(CompactionLog)
    run, later, retry = log.alias("run"), log.alias("later"), log.alias("retry")
    settled = sa_select(later.c.id).where(
        later.c.conversation_id == run.c.conversation_id,
        later.c.id > run.c.id,
        later.c.action.in_(SETTLING_ACTIONS),
    )
    retries = (
        sa_select(func.count())
        .where(
            retry.c.conversation_id == run.c.conversation_id,
            retry.c.task_id == run.c.task_id,
            retry.c.action == Action.RETRY,
        )
        .scalar_subquery()
    )
    statement = (
        sa_select(run.c.conversation_id, run.c.created_at, run.c.reason, run.c.task_id, retries)
        .where(run.c.action == Action.FAILED, run.c.created_at >= since, ~settled.exists())
        .order_by(run.c.created_at.desc(), run.c.id.desc())
        .limit(limit)
    )
    if conversation_ids is not None:
        statement = statement.where(run.c.conversation_id.in_(list(conversation_ids)))
    return [
        FailedRun(str(cid), as_utc(at) or at, str(reason), int(count) + 1, task_id)
        for cid, at, reason, task_id, count in session.connection().execute(statement)
    ]
