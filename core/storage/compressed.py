"""What compression recorded beside a conversation's messages, read back as of a moment: its
summaries (newest first) and the clearing steps of its tool results, merged per message."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam
from sqlalchemy import select as sa_select
from sqlmodel import Session

from recap.core.storage.models import CLEARINGS, SUMMARIES
from recap.core.storage.store import as_utc
from recap.core.values.records import ClearingRec, SummaryRec, merge_step

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
