"""The provider's usage readings of a conversation's requests, beside Recap's estimates: written
by ``record_usage`` (the host API, the adapters, ``recap serve``), read back for calibration,
stats and the console."""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy import select as sa_select
from sqlmodel import Session

from recap.core.counting import calibration, kinds
from recap.core.errors import InputError
from recap.core.storage.models import Usage, utcnow
from recap.core.storage.store import get_conversation


def record_usage(  # noqa: PLR0913 - one reading, each count named as the provider reports it
    session: Session,
    conversation_id: str,
    *,
    estimated_tokens: int,
    prompt_tokens: int,
    completion_tokens: int = 0,
    cached_tokens: int = 0,
    leaf_message_id: int | None = None,
    cache_write_tokens: int = 0,
    composition: tuple[float, ...] | None = None,
) -> int:
    """Store what the provider reported for a request, beside Recap's estimate of it."""
    get_conversation(session, conversation_id)
    counts = (prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, estimated_tokens)
    if any(count < 0 for count in counts):
        raise InputError("token counts must not be negative")
    row = Usage(
        conversation_id=conversation_id,
        leaf_message_id=leaf_message_id,
        estimated_tokens=estimated_tokens,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        cache_write_tokens=cache_write_tokens,
        created_at=utcnow(),
        kinds=kinds.encode(composition),
    )
    session.add(row)
    session.flush()
    return int(row.id or 0)


def cache_totals(session: Session, conversation_id: str) -> tuple[int, int, int]:
    """The conversation's recorded readings added up: prompt tokens, cached tokens, tokens
    written to the cache."""
    u = Usage.__table__.c  # type: ignore[attr-defined]
    row = (
        session.connection()
        .execute(
            sa_select(
                func.coalesce(func.sum(u.prompt_tokens), 0),
                func.coalesce(func.sum(u.cached_tokens), 0),
                func.coalesce(func.sum(u.cache_write_tokens), 0),
            ).where(u.conversation_id == conversation_id)
        )
        .one()
    )
    return int(row[0]), int(row[1]), int(row[2])


def summarizer_totals(session: Session, conversation_id: str) -> tuple[int, int]:
    """The summarizer's input tokens over the conversation's logged runs, and the part of them
    read from the provider's cache (its request on the chat's prefix)."""
    from recap.core.storage.models import CompactionLog

    log = CompactionLog.__table__.c  # type: ignore[attr-defined]
    row = (
        session.connection()
        .execute(
            sa_select(
                func.coalesce(func.sum(log.input_tokens), 0),
                func.coalesce(func.sum(log.cached_input_tokens), 0),
            ).where(log.conversation_id == conversation_id)
        )
        .one()
    )
    return int(row[0]), int(row[1])


def recent_samples(
    session: Session, conversation_id: str, limit: int = calibration.WINDOW
) -> list[calibration.Sample]:
    """The newest ``limit`` readings of known composition, newest first: what the calibration
    per kind of content is fitted from."""
    u = Usage.__table__.c  # type: ignore[attr-defined]
    rows = (
        session.connection()
        .execute(
            sa_select(u.kinds, u.prompt_tokens)
            .where(u.conversation_id == conversation_id, u.kinds.is_not(None))
            .order_by(u.id.desc())
            .limit(limit)
        )
        .all()
    )
    samples = []
    for stored, measured in rows:
        composition = kinds.decode(stored)
        if composition is not None:
            samples.append(calibration.Sample(composition, int(measured)))
    return samples
