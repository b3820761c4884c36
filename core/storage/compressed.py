"""What compression recorded beside a conversation's messages, read back as of a moment: its
summaries (newest first) and the clearing steps of its tool results, merged per message."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, and_, bindparam, update
from sqlalchemy import select as sa_select
from sqlmodel import Session

from recap.core.storage.models import CLEARINGS, SUMMARIES
from recap.core.storage.store import as_utc
from recap.core.values.records import ClearingRec, SummaryRec, merge_step

WITH_SUMMARY = "post_summary"  # ``core.decision.toolresults.POST_SUMMARY``: a run's batch
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
        SUMMARIES.c.pending,
        SUMMARIES.c.activated_at,
        SUMMARIES.c.provider_items,
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
    when given: the request as it was then). A summary is ``pending`` while it waits for its
    first use (``core.decision.activation``), and as of ``before`` when it was first used later."""
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
            pending=bool(row[8]) or _later(row[9], before),
            provider_items=row[10],
        )
        for row in rows
    ]


def _later(activated: datetime | None, before: datetime | None) -> bool:
    """Whether a summary first used at ``activated`` was still waiting at ``before``."""
    if before is None or activated is None:
        return False
    return (as_utc(activated) or activated) > before


def activate_summary(connection: Connection, summary_id: int, now: datetime) -> None:
    """Record a pending summary's first use (``core.decision.activation``); one in use stays."""
    c = SUMMARIES.c
    statement = (
        update(SUMMARIES)
        .where(c.id == summary_id, c.pending.is_(True))
        .values(pending=False, activated_at=now)
    )
    connection.execute(statement)


def load_clearings(
    session: Session,
    conversation_id: str,
    before: datetime | None = None,
    *,
    waiting_since: datetime | None = None,
) -> dict[int, ClearingRec]:
    """How each recorded message of the conversation renders, by message id: its steps (aged,
    cleared, shortened arguments...) merged by ``core.values.records.merge_step``; only the
    steps recorded at or before ``before`` when given. ``waiting_since`` (a ready summary's
    time) leaves out the steps its run recorded after it (``post_summary``): they wait with it."""
    statement = _CLEARINGS_OF
    if before is not None:
        statement = statement.where(CLEARINGS.c.created_at <= before)
    if waiting_since is not None:
        statement = statement.where(
            ~and_(CLEARINGS.c.created_at >= waiting_since, CLEARINGS.c.reason == WITH_SUMMARY)
        )
    rows = session.connection().execute(statement, {"conversation_id": conversation_id})
    found: dict[int, ClearingRec] = {}
    for message_id, reason, reclaimed, stage, chars in rows:
        mid = int(message_id)
        found[mid] = merge_step(found.get(mid), mid, reason, int(reclaimed), stage, chars)
    return found
