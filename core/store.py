"""Reading and writing conversations. Each function takes a short-lived ``Session``; the callers
own the transaction, so an import is all-or-nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from core import limits, tokens
from core.branch import applicable_summary, branch_ids
from core.errors import InputError, NotFoundError
from core.hashing import message_hash
from core.models import (
    CLEARINGS,
    CONVERSATIONS,
    MESSAGES,
    SUMMARIES,
    Conversation,
    Message,
    Usage,
    utcnow,
)
from core.records import ClearingRec, Msg, SummaryRec
from core.validate import KNOWN_KEYS, check_message, check_record, check_tool_pairing

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


# Keys the ingest step (core.outputs.Ingest) adds for the output_path/original_bytes columns.
INGEST_KEYS = ("_output_path", "_original_bytes")


@dataclass(frozen=True)
class BranchState:
    """Plain values copied out of one read: everything the request view is derived from."""

    conversation_id: str
    model: str
    max_input_tokens: int | None
    branch: list[Msg]
    summary: SummaryRec | None
    clearings: dict[int, ClearingRec]

    @property
    def leaf_id(self) -> int | None:
        return self.branch[-1].id if self.branch else None


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
) -> dict[str, Any]:
    """The column values of a validated OpenAI-format message, its tokens counted once; the
    content hash is of ``source``, the message as it arrived before ingest (default: itself)."""
    content = message.get("content")
    extra = {k: v for k, v in message.items() if k not in KNOWN_KEYS and k not in INGEST_KEYS}
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
        "output_path": message.get("_output_path"),
        "original_bytes": message.get("_original_bytes"),
        "content_hash": message_hash(message if source is None else source),
    }


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


def insert_chain(
    session: Session,
    conversation: Conversation,
    rows: Sequence[dict[str, Any]],
    parent_id: int | None,
) -> list[int]:
    """Insert rows as a chain under ``parent_id``; returns their ids in order."""
    ids: list[int] = []
    now = utcnow()
    for values in rows:
        statement = (
            insert(Message)
            .values(conversation_id=conversation.id, parent_id=parent_id, created_at=now, **values)
            .returning(col(Message.id))
        )
        parent_id = int(session.execute(statement).scalar_one())
        ids.append(parent_id)
    conversation.last_activity_at = now
    session.add(conversation)
    return ids


def import_records(
    session: Session,
    records: Sequence[Mapping[str, Any]],
    *,
    default_model: str,
    model: str | None = None,
    max_input_tokens: int | None = None,
    prepare: Any = None,
) -> list[tuple[str, int]]:
    """Import validated records; the caller's transaction makes the whole file one unit."""
    seen: set[str] = set()
    result: list[tuple[str, int]] = []
    for index, record in enumerate(records):
        where = f"conversation {index + 1}"
        messages = check_record(record, where)
        cid = str(record["id"]) if record.get("id") is not None else None
        if cid is not None and cid in seen:
            raise InputError(f"{where}: duplicate id {cid!r} in the file")
        meta = {k: v for k, v in record.items() if k not in ("id", "messages")}
        conversation = create_conversation(
            session, cid, model or default_model, max_input_tokens, meta
        )
        seen.add(conversation.id)
        encoding = tokens.encoding_name_for(conversation.model)
        rows = [
            row_values(prepare(m) if prepare else m, encoding, source=m, model=conversation.model)
            for m in messages
        ]
        ids = insert_chain(session, conversation, rows, None)
        result.append((conversation.id, len(ids)))
    return result


def add_message(
    session: Session,
    conversation_id: str,
    message: Mapping[str, Any],
    parent_id: int | None = None,
    prepare: Any = None,
) -> int:
    """Append one message after ``parent_id`` (default: the latest message), checking its pair."""
    conversation = get_conversation(session, conversation_id)
    checked = check_message(message, "message")
    if parent_id is None:
        parent_id = latest_message_id(session, conversation_id)
    elif session.get(Message, parent_id) is None or (
        session.get(Message, parent_id).conversation_id != conversation_id  # type: ignore[union-attr]
    ):
        raise NotFoundError(f"message {parent_id} is not in conversation {conversation_id!r}")
    if checked["role"] == "tool":
        branch = load_branch(session, conversation_id, parent_id) if parent_id else []
        answered = {m.tool_call_id for m in branch if m.role == "tool"}
        calls = {cid for m in branch for cid in m.tool_call_ids} - answered
        check_tool_pairing([checked], "message", open_calls=calls)
    encoding = tokens.encoding_name_for(conversation.model)
    values = row_values(
        prepare(checked) if prepare else checked,
        encoding,
        source=checked,
        model=conversation.model,
    )
    return insert_chain(session, conversation, [values], parent_id)[0]


def latest_message_id(session: Session, conversation_id: str) -> int | None:
    """The newest message of the conversation (the default leaf)."""
    statement = select(func.max(Message.id)).where(Message.conversation_id == conversation_id)
    value = session.exec(statement).one()
    return int(value) if value is not None else None


def _to_msg(row: Any) -> Msg:
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


def load_messages(session: Session, conversation_id: str) -> dict[int, Msg]:
    """Every message of the conversation by id, as plain values."""
    statement = (
        sa_select(*MESSAGE_COLUMNS)
        .where(MESSAGES.c.conversation_id == conversation_id)
        .order_by(MESSAGES.c.id)
    )
    return {int(row[0]): _to_msg(row) for row in session.connection().execute(statement)}


@dataclass(frozen=True)
class TokenIndex:
    """The token counts of one branch, without any text: what pressure checks need."""

    conversation_id: str
    model: str
    max_input_tokens: int | None
    leaf_id: int | None
    branch: list[Msg]
    summary: SummaryRec | None
    clearings: dict[int, ClearingRec]


def load_token_index(session: Session, conversation_id: str, leaf: int | None = None) -> TokenIndex:
    """Ids, parents and stored counts of a branch (no content is read)."""
    connection = session.connection()
    head = connection.execute(
        sa_select(CONVERSATIONS.c.model, CONVERSATIONS.c.max_input_tokens).where(
            CONVERSATIONS.c.id == conversation_id
        )
    ).first()
    if head is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    m = MESSAGES.c
    statement = sa_select(m.id, m.parent_id, m.tokens, m.role).where(
        m.conversation_id == conversation_id
    )
    rows = {int(r[0]): (r[1], int(r[2]), str(r[3])) for r in connection.execute(statement)}
    path: list[int] = []
    if rows:
        leaf = max(rows) if leaf is None else leaf
        if leaf not in rows:
            raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
        path = branch_ids({mid: row[0] for mid, row in rows.items()}, leaf)
    elif leaf is not None:
        raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
    branch = [
        Msg(id=mid, parent_id=rows[mid][0], role=rows[mid][2], content=None, tokens=rows[mid][1])
        for mid in path
    ]
    summary = applicable_summary(load_summaries(session, conversation_id), set(path))
    return TokenIndex(
        conversation_id=conversation_id,
        model=head[0],
        max_input_tokens=head[1],
        leaf_id=path[-1] if path else None,
        branch=branch,
        summary=summary,
        clearings=load_clearings(session, conversation_id),
    )


def load_branch(session: Session, conversation_id: str, leaf: int | None = None) -> list[Msg]:
    """The messages from the root to ``leaf`` (default: the latest message)."""
    messages = load_messages(session, conversation_id)
    if leaf is None:
        if not messages:
            return []
        leaf = max(messages)
    if leaf not in messages:
        raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")
    path = branch_ids({mid: m.parent_id for mid, m in messages.items()}, leaf)
    return [messages[mid] for mid in path]


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
_CLEARINGS_OF = sa_select(
    CLEARINGS.c.message_id, CLEARINGS.c.reason, CLEARINGS.c.tokens_reclaimed
).where(CLEARINGS.c.conversation_id == bindparam("conversation_id"))


def load_summaries(session: Session, conversation_id: str) -> list[SummaryRec]:
    """The conversation's summaries, oldest first."""
    rows = session.connection().execute(_SUMMARIES_OF, {"conversation_id": conversation_id})
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


def load_clearings(session: Session, conversation_id: str) -> dict[int, ClearingRec]:
    """The cleared tool results of the conversation, by message id."""
    rows = session.connection().execute(_CLEARINGS_OF, {"conversation_id": conversation_id})
    return {int(row[0]): ClearingRec(int(row[0]), row[1], int(row[2])) for row in rows}


def load_state(session: Session, conversation_id: str, leaf: int | None = None) -> BranchState:
    """One read of everything the request view needs, copied out as plain values."""
    conversation = get_conversation(session, conversation_id)
    branch = load_branch(session, conversation_id, leaf)
    summary = applicable_summary(load_summaries(session, conversation_id), {m.id for m in branch})
    return BranchState(
        conversation_id=conversation.id,
        model=conversation.model,
        max_input_tokens=conversation.max_input_tokens,
        branch=branch,
        summary=summary,
        clearings=load_clearings(session, conversation_id),
    )


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


def touch(session: Session, conversation_ids: Iterable[str]) -> None:
    """Mark conversations active now."""
    session.execute(
        update(Conversation)
        .where(col(Conversation.id).in_(list(conversation_ids)))
        .values(last_activity_at=utcnow())
    )


# --- failed runs -------------------------------------------------------------------------------

FAILED_RUNS_LIMIT = 1_000  # one screen of an operator's list; more means a wider outage to fix
# Runs after a failure that settle it: the conversation was brought under its trigger since.
SETTLING_ACTIONS = ("failed", "summarized", "cleared")


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
    from core.models import CompactionLog, table_of

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
            retry.c.action == "retry",
        )
        .scalar_subquery()
    )
    statement = (
        sa_select(run.c.conversation_id, run.c.created_at, run.c.reason, run.c.task_id, retries)
        .where(run.c.action == "failed", run.c.created_at >= since, ~settled.exists())
        .order_by(run.c.created_at.desc(), run.c.id.desc())
        .limit(limit)
    )
    if conversation_ids is not None:
        statement = statement.where(run.c.conversation_id.in_(list(conversation_ids)))
    return [
        FailedRun(str(cid), as_utc(at) or at, str(reason), int(count) + 1, task_id)
        for cid, at, reason, task_id, count in session.connection().execute(statement)
    ]
