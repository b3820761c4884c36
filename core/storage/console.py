"""The web console's reads (``workers.ui``): the conversations list, paginated in the database,
and the rows one conversation's page shows beside its branch (the compaction log, provider
readings, when messages, summaries and clearings were written, the branches to switch between).

Reads only. The list is two statements: the page's ids (filtered, sorted and cut by the database,
so a page costs about the same among ten conversations and ten thousand), then the figures of
those ids alone (message counts and stored tokens from the index on (conversation, id, parent),
the latest run, the failures). Nothing here loads every row of a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, literal, select
from sqlalchemy.sql import ColumnElement

from core.storage.models import (
    CLEARINGS,
    CONVERSATIONS,
    MESSAGES,
    CompactionLog,
    Usage,
    table_of,
)
from core.storage.store import as_utc

LOG = table_of(CompactionLog)
USAGE = table_of(Usage)
C, M, L = CONVERSATIONS.c, MESSAGES.c, LOG.c

FAILED = "failed"
SORTS = ("activity", "id", "messages", "tokens", "failures")  # what the list can sort by
PAGE_SIZE_MAX = 200  # rows one page may ask for
SEARCH_CHARS_MAX = 255  # a conversation id is at most this long, so a longer search finds nothing
LOG_ROWS = 200  # compaction-log rows one conversation page shows, newest first
USAGE_ROWS = 2_000  # provider readings one conversation page charts, newest first
BRANCHES_MAX = 50  # branch heads one conversation page offers


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """One line of the conversations list."""

    id: str
    owner: str | None
    model: str
    max_input_tokens: int | None
    last_activity_at: datetime | None
    messages: int
    stored_tokens: int  # every stored message of every branch, as counted at ingest
    last_action: str | None
    last_run_at: datetime | None
    failures: int  # failed runs in the retained compaction log


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ConversationRow]
    total: int  # conversations matching the filter, across all pages


@dataclass(frozen=True, slots=True)
class Run:
    """One compaction-log row as the conversation page shows it."""

    id: int
    created_at: datetime | None
    last_seen_at: datetime | None
    repeats: int
    trigger: str
    action: str
    reason: str
    tokens_before: int
    tokens_after: int
    duration_ms: int
    model: str | None
    error: str | None
    summary_id: int | None
    leaf_message_id: int | None
    task_id: str | None


@dataclass(frozen=True, slots=True)
class Reading:
    """A provider's usage report of one request."""

    leaf_message_id: int | None
    prompt_tokens: int
    estimated_tokens: int
    created_at: datetime | None


def _like(search: str) -> str:
    escaped = search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filters(search: str, owner: str | None, scoped: bool) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if scoped:  # a client key's view: its own conversations only (none when it has no owner)
        where.append(C.owner == owner if owner is not None else literal(False))
    if search:
        pattern = _like(search[:SEARCH_CHARS_MAX])
        where.append(func.lower(C.id).like(pattern, escape="\\"))
    return where


def _sort_key(sort: str) -> ColumnElement[Any]:
    """The column a sort orders by; the figures are correlated subqueries the database works out
    for the ordering only when that sort is asked for."""
    if sort == "id":
        return C.id
    if sort == "messages":
        return select(func.count()).where(M.conversation_id == C.id).scalar_subquery()
    if sort == "tokens":
        return (
            select(func.coalesce(func.sum(M.tokens), 0))
            .where(M.conversation_id == C.id)
            .scalar_subquery()
        )
    if sort == "failures":
        return (
            select(func.count())
            .where(L.conversation_id == C.id, L.action == FAILED)
            .scalar_subquery()
        )
    return C.last_activity_at


def list_conversations(
    connection: Connection,
    *,
    search: str = "",
    owner: str | None = None,
    scoped: bool = False,
    sort: str = "activity",
    descending: bool = True,
    limit: int = 25,
    offset: int = 0,
) -> Page:
    """One page of conversations whose id contains ``search`` (any case); with ``scoped``, only
    those ``owner`` created. ``sort`` is one of ``SORTS``; ties are broken by id."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    limit = max(1, min(limit, PAGE_SIZE_MAX))
    where = _filters(search, owner, scoped)
    key = _sort_key(sort)
    order = [key.desc() if descending else key.asc()]
    if sort != "id":
        order.append(C.id.desc() if descending else C.id.asc())
    ids_statement = select(C.id).where(*where).order_by(*order).limit(limit).offset(max(offset, 0))
    ids = [str(row[0]) for row in connection.execute(ids_statement)]
    total = int(
        connection.execute(
            select(func.count()).select_from(CONVERSATIONS).where(*where)
        ).scalar_one()
    )
    return Page(rows=_rows_of(connection, ids), total=total)


def _rows_of(connection: Connection, ids: Sequence[str]) -> list[ConversationRow]:
    """The list's figures of these conversations, in the order given."""
    if not ids:
        return []
    heads = {
        str(row[0]): row
        for row in connection.execute(
            select(C.id, C.owner, C.model, C.max_input_tokens, C.last_activity_at).where(
                C.id.in_(ids)
            )
        )
    }
    counts = {
        str(cid): (int(n), int(total or 0))
        for cid, n, total in connection.execute(
            select(M.conversation_id, func.count(), func.sum(M.tokens))
            .where(M.conversation_id.in_(ids))
            .group_by(M.conversation_id)
        )
    }
    failures = {
        str(cid): int(n)
        for cid, n in connection.execute(
            select(L.conversation_id, func.count())
            .where(L.conversation_id.in_(ids), L.action == FAILED)
            .group_by(L.conversation_id)
        )
    }
    latest_ids = (
        select(func.max(L.id)).where(L.conversation_id.in_(ids)).group_by(L.conversation_id)
    )
    latest = {
        str(cid): (str(action), as_utc(seen or at))
        for cid, action, at, seen in connection.execute(
            select(L.conversation_id, L.action, L.created_at, L.last_seen_at).where(
                L.id.in_(latest_ids)
            )
        )
    }
    rows = []
    for cid in ids:
        head = heads.get(cid)
        if head is None:  # deleted between the two statements
            continue
        messages, tokens = counts.get(cid, (0, 0))
        action, run_at = latest.get(cid, (None, None))
        rows.append(
            ConversationRow(
                id=cid,
                owner=head[1],
                model=str(head[2]),
                max_input_tokens=head[3],
                last_activity_at=as_utc(head[4]),
                messages=messages,
                stored_tokens=tokens,
                last_action=action,
                last_run_at=run_at,
                failures=failures.get(cid, 0),
            )
        )
    return rows


def owner_of(connection: Connection, conversation_id: str) -> tuple[bool, str | None]:
    """Whether the conversation exists, and the fingerprint of the key that created it."""
    row = connection.execute(select(C.owner).where(C.id == conversation_id)).first()
    return (row is not None, row[0] if row is not None else None)


def runs(connection: Connection, conversation_id: str, limit: int = LOG_ROWS) -> list[Run]:
    """The conversation's compaction-log rows, newest first."""
    statement = (
        select(
            L.id,
            L.created_at,
            L.last_seen_at,
            L.repeats,
            L.trigger,
            L.action,
            L.reason,
            L.tokens_before,
            L.tokens_after,
            L.duration_ms,
            L.model,
            L.error,
            L.summary_id,
            L.leaf_message_id,
            L.task_id,
        )
        .where(L.conversation_id == conversation_id)
        .order_by(L.id.desc())
        .limit(limit)
    )
    return [
        Run(
            id=int(r[0]),
            created_at=as_utc(r[1]),
            last_seen_at=as_utc(r[2]),
            repeats=int(r[3] or 1),
            trigger=str(r[4]),
            action=str(r[5]),
            reason=str(r[6] or ""),
            tokens_before=int(r[7] or 0),
            tokens_after=int(r[8] or 0),
            duration_ms=int(r[9] or 0),
            model=r[10],
            error=r[11],
            summary_id=r[12],
            leaf_message_id=r[13],
            task_id=r[14],
        )
        for r in connection.execute(statement)
    ]


def readings(
    connection: Connection, conversation_id: str, limit: int = USAGE_ROWS
) -> list[Reading]:
    """The provider's usage reports of the conversation's requests, oldest first (the newest
    ``limit`` of them)."""
    u = USAGE.c
    statement = (
        select(u.leaf_message_id, u.prompt_tokens, u.estimated_tokens, u.created_at)
        .where(u.conversation_id == conversation_id)
        .order_by(u.id.desc())
        .limit(limit)
    )
    found = [
        Reading(leaf, int(prompt), int(estimated), as_utc(at))
        for leaf, prompt, estimated, at in connection.execute(statement)
    ]
    found.reverse()
    return found


def message_times(connection: Connection, conversation_id: str) -> dict[int, datetime]:
    """When each message of the conversation was stored."""
    statement = select(M.id, M.created_at).where(M.conversation_id == conversation_id)
    return {int(mid): as_utc(at) or at for mid, at in connection.execute(statement)}


def clearing_times(connection: Connection, conversation_id: str) -> dict[int, datetime]:
    """When each message's latest recorded step (aged, cleared...) was recorded, by message id."""
    k = CLEARINGS.c
    statement = (
        select(k.message_id, k.created_at)
        .where(k.conversation_id == conversation_id)
        .order_by(k.id)
    )
    return {int(mid): as_utc(at) or at for mid, at in connection.execute(statement)}


def branch_heads(
    connection: Connection, conversation_id: str, limit: int = BRANCHES_MAX
) -> list[tuple[int, datetime | None]]:
    """The newest messages that no message answers (each ends a branch), newest first."""
    child = MESSAGES.alias("child")
    has_child = select(child.c.id).where(child.c.parent_id == M.id).exists()
    statement = (
        select(M.id, M.created_at)
        .where(M.conversation_id == conversation_id, ~has_child)
        .order_by(M.id.desc())
        .limit(limit)
    )
    return [(int(mid), as_utc(at)) for mid, at in connection.execute(statement)]
