"""What a response id names, read back for ``recap serve``: the stored reply a Responses API
``previous_response_id`` continues after, the reply ``GET /v1/responses/{id}`` gives again, and
the response ids a ``DELETE`` made name nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, func, select

from recap.core.errors import NotFoundError
from recap.core.storage import store
from recap.core.storage.models import CONVERSATIONS, MESSAGES, Usage, table_of
from recap.core.values.serving import StoredReply


def reply_to_continue(
    engine: Any, conversation_id: str, message_id: int, *, exact: bool, owner: str
) -> int:
    """The stored reply a response id continues after (the Responses API's
    ``previous_response_id``): the message it names when ``exact``, else the newest reply stored
    after it; a ``NotFoundError`` when ``owner`` does not own the conversation or the message is
    not there (a stream that never finished)."""
    m = MESSAGES.c
    with engine.connect() as connection:
        if not store.owned_by(connection, conversation_id, owner):
            raise NotFoundError(conversation_id)
        where = m.conversation_id == conversation_id
        if exact:
            statement = select(m.id).where(and_(where, m.id == message_id))
        else:
            statement = select(func.max(m.id)).where(
                and_(where, m.parent_id == message_id, m.role == "assistant")
            )
        row = connection.execute(statement).first()
        found = None if row is None else row[0]
        if found is None or found in deleted_responses(connection, conversation_id):
            raise NotFoundError(conversation_id)
    return int(found)


# A conversation's ``meta`` key listing the stored replies whose response was deleted
# (``DELETE /v1/responses/{id}``): they stay in the history, their response id names nothing.
DELETED_RESPONSES = "responses_deleted"


def deleted_responses(connection: Connection, conversation_id: str) -> set[int]:
    """The stored replies of the conversation whose response was deleted."""
    meta = connection.execute(
        select(CONVERSATIONS.c.meta).where(CONVERSATIONS.c.id == conversation_id)
    ).scalar()
    listed = meta.get(DELETED_RESPONSES) if isinstance(meta, dict) else None
    return {int(v) for v in listed or () if isinstance(v, int)}


def stored_reply(
    engine: Any, conversation_id: str, message_id: int, *, exact: bool, owner: str
) -> StoredReply:
    """The reply a response id names (``reply_to_continue``); a ``NotFoundError`` as there, or
    when the message it names is not the model's."""
    reply_id = reply_to_continue(engine, conversation_id, message_id, exact=exact, owner=owner)
    m, u = MESSAGES.c, table_of(Usage).c
    with engine.connect() as connection:
        row = connection.execute(
            select(*store.MESSAGE_COLUMNS, m.created_at, CONVERSATIONS.c.model)
            .join(CONVERSATIONS, CONVERSATIONS.c.id == m.conversation_id)
            .where(and_(m.conversation_id == conversation_id, m.id == reply_id))
        ).first()
        if row is None or row[2] != "assistant":
            raise NotFoundError(conversation_id)
        usage = connection.execute(
            select(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
            .where(and_(u.conversation_id == conversation_id, u.leaf_message_id == row[1]))
            .order_by(u.id.desc())
            .limit(1)
        ).first()
    created = store.as_utc(row[-2])
    assert created is not None, "a stored message has its time"
    return StoredReply(
        id=reply_id,
        message=store.to_msg(row).to_openai(),
        created_at=created,
        model=str(row[-1]),
        usage=(int(usage[0]), int(usage[1]), int(usage[2])) if usage is not None else None,
    )
