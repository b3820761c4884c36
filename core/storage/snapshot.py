"""Reading what the compression decision looks at (``core.decision.policy.Snapshot``), and
afterwards the text of the messages a summary covers.

The snapshot is content-free: the branch comes from ids and parents
(``core.storage.reads.branch_path``), then the root and the messages after the applicable summary's
cutoff are read without their text: role, stored tokens, tool-call ids and names (arguments
dropped, but for those long enough to be shortened once old: the aged stage counts what that
saves), the call a result answers, its tool name and saved-output path. Text is read by
``load_contents`` for the messages sent to the summarizer only. ``history_bound`` answers "is this
conversation anywhere near its trigger" from the stored counts of the messages after the latest
summary alone (a walk up the branch by primary key), so a run that skips costs about the same at
50 messages and at 5,000.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, select, text
from sqlmodel import Session

from recap.core.decision import policy
from recap.core.decision.toolresults import ARGUMENT_AGED_CHARS
from recap.core.errors import NotFoundError
from recap.core.request.attach import expand
from recap.core.request.branch import applicable_summary
from recap.core.request.pins import effective_clearings
from recap.core.storage import attachments, compressed, store
from recap.core.storage.models import (
    CONVERSATIONS,
    MESSAGES,
    SUMMARIES,
    CompactionLog,
    table_of,
    utcnow,
)
from recap.core.storage.pins import load_pins, pinned_tokens_up_to
from recap.core.storage.profile import load_profile
from recap.core.storage.reads import branch_path
from recap.core.summaries.planning import COOLDOWN_MAX_FACTOR
from recap.core.values.actions import Action
from recap.core.values.records import SYSTEM_ROLES, Msg

COMPACTION_LOG = table_of(CompactionLog)
COOLDOWN_DOUBLINGS = COOLDOWN_MAX_FACTOR.bit_length()  # failures read past the streak
ID_CHUNK = 500  # ids per IN list when reading rows by id: far below every bound-parameter limit

M = MESSAGES.c
_HEAD = select(CONVERSATIONS.c.model, CONVERSATIONS.c.max_input_tokens).where(
    CONVERSATIONS.c.id == bindparam("conversation_id")
)
_LIGHT = select(
    M.id, M.parent_id, M.role, M.tokens, M.tool_calls, M.tool_call_id, M.name, M.output_path
).where(
    M.conversation_id == bindparam("conversation_id"), M.id.in_(bindparam("ids", expanding=True))
)
_LATEST_SUMMARY = (
    select(SUMMARIES.c.cutoff_message_id, SUMMARIES.c.tokens)
    .where(SUMMARIES.c.conversation_id == bindparam("conversation_id"))
    .order_by(SUMMARIES.c.cutoff_message_id.desc())
    .limit(1)
)


# The latest branch from its newest message up, each step a primary-key lookup of the parent,
# as far as the first message at or before the cutoff: the tokens of the messages after the
# cutoff, the id the walk stopped at, and the newest id.
_WALK = text(
    """
WITH RECURSIVE up(id, parent_id, tokens) AS (
    SELECT m.id, m.parent_id, m.tokens
    FROM messages AS m
    WHERE m.id = (SELECT max(h.id) FROM messages AS h WHERE h.conversation_id = :conversation_id)
  UNION ALL
    SELECT m.id, m.parent_id, m.tokens
    FROM up JOIN messages AS m ON m.id = up.parent_id
    WHERE up.id > :cutoff
)
SELECT sum(CASE WHEN up.id > :cutoff THEN up.tokens ELSE 0 END), min(up.id), max(up.id),
       sum(CASE WHEN up.id > :cutoff
                THEN coalesce(c.tokens_reclaimed, a.tokens_reclaimed, 0)
                     + coalesce(g.tokens_reclaimed, 0)
                ELSE 0 END)
FROM up
LEFT JOIN clearings AS c ON c.message_id = up.id AND c.stage = 'cleared' AND (
    c.reason = 'reasoning' OR NOT EXISTS (SELECT 1 FROM pins AS p WHERE p.message_id = up.id)
)
LEFT JOIN clearings AS a ON a.message_id = up.id AND a.stage = 'aged'
    AND NOT EXISTS (SELECT 1 FROM pins AS p WHERE p.message_id = up.id)
LEFT JOIN clearings AS g ON g.message_id = up.id AND g.stage = 'arguments'
    AND NOT EXISTS (SELECT 1 FROM pins AS p WHERE p.message_id = up.id)
"""
)
_ROOT_TOKENS = (
    select(M.tokens, M.role, M.id)
    .where(M.conversation_id == bindparam("conversation_id"))
    .order_by(M.id)
    .limit(1)
)


def _head(connection: Connection, conversation_id: str) -> tuple[str, int | None]:
    row = connection.execute(_HEAD, {"conversation_id": conversation_id}).first()
    if row is None:
        raise NotFoundError(f"unknown conversation {conversation_id!r}")
    return str(row[0]), row[1]


def read_snapshot(
    session: Session,
    conversation_id: str,
    leaf: int | None = None,
    *,
    now: datetime | None = None,
    failures: int = 0,
) -> policy.Snapshot:
    """The content-free snapshot of the branch ending at ``leaf`` (default: the latest message),
    with up to ``failures`` of the newest failed runs since the last summary."""
    connection = session.connection()
    model, override = _head(connection, conversation_id)
    sources = attachments.live_sources(connection, conversation_id)  # first: see its docstring
    path = branch_path(connection, conversation_id, leaf)
    summary = applicable_summary(compressed.load_summaries(session, conversation_id), set(path))
    pins = load_pins(connection, conversation_id)
    pinned_ids = [mid for mid in path if mid in pins] if pins else []
    clearings = dict(effective_clearings(compressed.load_clearings(session, conversation_id), pins))
    wanted = path
    if summary is not None and summary.cutoff_message_id in path:
        start = path.index(summary.cutoff_message_id)
        wanted = [path[0], *path[start:]] if start else path
    branch = load_index(connection, conversation_id, wanted)
    read = {m.id: m for m in branch}
    missing = [mid for mid in pinned_ids if mid not in read]
    read.update((m.id, m) for m in load_index(connection, conversation_id, missing))
    spans: tuple[tuple[int, int], ...] = ()
    pointers = attachments.pointers_of(connection, conversation_id)
    if pointers:  # attached items are decided on like the branch's own
        expansion = expand(branch, pointers, attachments.source_loader(connection, conversation_id))
        branch, spans = expansion.branch, expansion.spans()
        if expansion.locked:
            read.update((m.id, m) for m in branch if m.id in expansion.locked)
            pinned_ids = [m.id for m in branch if m.id in expansion.locked or m.id in pinned_ids]
            clearings = {k: v for k, v in clearings.items() if k not in expansion.locked}
    return policy.Snapshot(
        conversation_id=conversation_id,
        model=model,
        window_override=override,
        branch=branch,
        summary=summary,
        clearings=clearings,
        profile=load_profile(connection, conversation_id),
        now=now or utcnow(),
        failures=tuple(recent_failures(connection, conversation_id, failures)),
        pinned=tuple(read[mid] for mid in pinned_ids if mid in read),
        attached=spans,
        sources=sources,
    )


def check_leaf(session: Session, conversation_id: str, leaf: int) -> None:
    """A ``NotFoundError`` unless ``leaf`` is a message of the conversation."""
    statement = select(M.id).where(M.conversation_id == conversation_id, M.id == leaf)
    if session.connection().execute(statement).first() is None:
        _head(session.connection(), conversation_id)  # an unknown conversation says so first
        raise NotFoundError(f"message {leaf} is not in conversation {conversation_id!r}")


def head_snapshot(
    session: Session, conversation_id: str, *, now: datetime | None = None
) -> policy.Snapshot:
    """The snapshot without its branch: enough for the budget (``policy.pressure`` with a
    history bound), not for a decision."""
    connection = session.connection()
    model, override = _head(connection, conversation_id)
    return policy.Snapshot(
        conversation_id=conversation_id,
        model=model,
        window_override=override,
        branch=(),
        summary=None,
        clearings={},
        profile=load_profile(connection, conversation_id),
        now=now or utcnow(),
    )


class Bound(NamedTuple):
    """What ``history_bound`` reads: the bound, the latest message, and the history estimate
    itself (what ``policy.history_estimate`` gives from the whole snapshot: clearings taken
    off, the stored system prompt left to the fixed parts), which a skip reports."""

    tokens: int
    leaf: int | None
    history: int


def history_bound(session: Session, conversation_id: str) -> Bound | None:
    """An upper bound on the stored tokens of the latest branch's history, and the latest
    message's id, read without any message text (else None: see below).

    The latest branch is walked from its newest message up its parent links, by primary key,
    down to the cutoff of the conversation's latest summary (``_WALK``): the rows read are the
    ones after that cutoff, so the cost follows what a request carries, not what is stored. When
    the walk reaches that cutoff, the summary applies (it has the highest cutoff of all, and it is
    on the branch) and the history is the summary and the messages walked; clearings can only
    lower it, and the stored system prompt is added (it is a fixed part, so counted here as
    history it makes the bound larger still). When the walk passes the cutoff by (the summary is
    on another branch), another summary may apply: None, and the caller reads the snapshot.
    The pinned messages the cutoff covers (any branch's) are added: they are sent after the
    summary.
    """
    connection = session.connection()
    params = {"conversation_id": conversation_id}
    latest = connection.execute(_LATEST_SUMMARY, params).first()
    cutoff, summary_tokens = (int(latest[0]), int(latest[1])) if latest else (0, 0)
    walked, reached, leaf, reclaimed = connection.execute(_WALK, {**params, "cutoff": cutoff}).one()
    if leaf is None:  # no message yet
        return Bound(summary_tokens, None, summary_tokens)
    if cutoff and reached != cutoff:
        return None
    root_row = connection.execute(_ROOT_TOKENS, params).first()
    root = int(root_row[0]) if root_row is not None else 0
    prompt = root if root_row is not None and root_row[1] in SYSTEM_ROLES else 0
    walked = int(walked or 0)
    is_prompt = root_row is not None and root_row[1] in SYSTEM_ROLES  # sent anyway
    root_id = int(root_row[2]) if root_row is not None and is_prompt else 0
    pinned = pinned_tokens_up_to(connection, conversation_id, cutoff, root_id) if cutoff else 0
    walked += attachments.tokens_after(connection, conversation_id, cutoff)  # their sources
    bound = summary_tokens + walked + pinned + (root if cutoff else 0)
    history = summary_tokens + walked + pinned - int(reclaimed or 0) - (0 if cutoff else prompt)
    return Bound(bound, int(leaf), history)


def load_index(connection: Connection, conversation_id: str, ids: Sequence[int]) -> list[Msg]:
    """The messages of ``ids`` (in that order) without their text."""
    rows: dict[int, Any] = {}
    for start in range(0, len(ids), ID_CHUNK):
        chunk = list(ids[start : start + ID_CHUNK])
        params = {"conversation_id": conversation_id, "ids": chunk}
        rows.update((int(row[0]), row) for row in connection.execute(_LIGHT, params))
    return [_light(rows[mid]) for mid in ids if mid in rows]


def _light(row: Any) -> Msg:
    mid, parent, role, count, calls, call_id, name, path = row
    if isinstance(calls, str):
        calls = json.loads(calls)
    slim = tuple(_slim_call(call) for call in calls or () if isinstance(call, dict))
    return Msg(
        id=mid,
        parent_id=parent,
        role=role,
        content=None,
        tokens=int(count),
        tool_calls=slim,
        tool_call_id=call_id,
        name=name,
        output_path=path,
    )


def _slim_call(call: dict[str, Any]) -> dict[str, Any]:
    """A call as the decision sees it: its id and tool name, and its arguments only when they
    are long enough to be shortened once the call is old (``toolresults.argument_saving``)."""
    function = call.get("function") or {}
    slim: dict[str, Any] = {"name": function.get("name")}
    arguments = function.get("arguments")
    if isinstance(arguments, str) and len(arguments) > ARGUMENT_AGED_CHARS:
        slim["arguments"] = arguments
    return {"id": call.get("id", ""), "function": slim}


def load_contents(session: Session, conversation_id: str, ids: Iterable[int]) -> dict[int, Msg]:
    """Whole rows (text included) of the given messages, by id."""
    wanted = sorted(set(ids))
    statement = select(*store.MESSAGE_COLUMNS).where(
        M.conversation_id == bindparam("conversation_id"),
        M.id.in_(bindparam("ids", expanding=True)),
    )
    connection = session.connection()
    found: dict[int, Msg] = {}
    for start in range(0, len(wanted), ID_CHUNK):
        params = {"conversation_id": conversation_id, "ids": wanted[start : start + ID_CHUNK]}
        for row in connection.execute(statement, params):
            found[int(row[0])] = store.to_msg(row)
    if len(found) < len(wanted):  # attached items are read from their sources
        found.update(
            attachments.attached_rows(connection, conversation_id, set(wanted) - set(found))
        )
    return found


def recent_failures(
    connection: Connection, conversation_id: str, streak: int
) -> list[policy.Failure]:
    """The conversation's failed runs since its last summary, newest first (as many as the
    cooldown can use: the streak and the doublings after it); none when ``streak`` is 0."""
    if streak <= 0:
        return []
    c = COMPACTION_LOG.c
    statement = (
        select(c.action, c.created_at, c.reason)
        .where(c.conversation_id == conversation_id)
        .where(c.action.in_((Action.FAILED, Action.SUMMARIZED)))
        .order_by(c.id.desc())
        .limit(streak + COOLDOWN_DOUBLINGS)
    )
    failures: list[policy.Failure] = []
    for action, at, reason in connection.execute(statement):
        if action != Action.FAILED:
            break
        failures.append(policy.Failure(store.as_utc(at) or utcnow(), str(reason)))
    return failures
