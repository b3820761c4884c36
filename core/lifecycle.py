"""A conversation's lifecycle for hosts and the CLI: pins, erasure, retention and the listing.

``pin`` and ``unpin`` keep a message verbatim in every request of its branches, within
``RECAP_MAX_PINNED_TOKENS`` (``core.storage.pins``); ``delete`` removes a conversation and
everything derived from it (``core.storage.erase``); ``expire`` applies
``RECAP_CONVERSATION_RETENTION_DAYS``; ``conversations`` lists one page of conversations with
their size, last activity and context pressure (``core.service``'s stats).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from recap.core import service
from recap.core.counting import budget as budgets
from recap.core.errors import InputError, NotFoundError
from recap.core.request import timeline as timelines
from recap.core.request.assembly import stored_prompt
from recap.core.request.refs import message_ref, span_ref
from recap.core.results import PinResult
from recap.core.service import attaching, conversation_stats
from recap.core.settings import Settings
from recap.core.storage import attachments, compressed, erase, pins, reads
from recap.core.storage import profile as profiles
from recap.core.storage.db import session_scope
from recap.core.storage.models import utcnow
from recap.core.values.records import Msg
from recap.core.values.request import RequestSpec

EXPIRE_BATCH = 100  # conversations one retention run deletes before it re-enqueues itself
MAX_PAGE = 1_000  # the largest page ``conversations`` returns


def pin(engine: Engine, conversation_id: str, message_id: int, settings: Settings) -> PinResult:
    """Pin a message of the conversation: ``NotFoundError`` when the conversation does not hold
    it, ``PinLimitError`` past ``RECAP_MAX_PINNED_TOKENS`` (nothing changes either way)."""
    return pins.pin(engine, conversation_id, message_id, max_tokens=settings.max_pinned_tokens)


def unpin(engine: Engine, conversation_id: str, message_id: int, settings: Settings) -> PinResult:
    """Unpin a message of the conversation (``NotFoundError`` when it does not hold it)."""
    return pins.unpin(engine, conversation_id, message_id, max_tokens=settings.max_pinned_tokens)


def delete(engine: Engine, conversation_id: str, settings: Settings) -> erase.Deleted:
    """Delete the conversation: every row and its own saved files (``NotFoundError`` if none)."""
    done = erase.delete_conversation(engine, conversation_id, settings.output_dir)
    assert done is not None  # only a retention delete (idle_before) can leave it
    return done


def expire(
    engine: Engine,
    settings: Settings,
    *,
    now: datetime | None = None,
    retention_days: float | None = None,
    limit: int | None = None,
) -> erase.Expired:
    """Delete up to ``limit`` (default ``EXPIRE_BATCH``) conversations idle longer than the
    retention (the setting unless given); nothing when no retention is set."""
    days = settings.conversation_retention_days if retention_days is None else retention_days
    if days is None:
        return erase.Expired()
    if days <= 0:
        raise InputError(f"the retention must be a positive number of days, got {days:g}")
    idle_before = (now or utcnow()) - timedelta(days=days)
    batch = EXPIRE_BATCH if limit is None else limit
    return erase.expire_idle(engine, settings.output_dir, idle_before=idle_before, limit=batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationInfo:
    """One conversation as ``recap conversations`` lists it."""

    id: str
    model: str
    messages: int
    tokens: int  # stored tokens of all its messages (every branch)
    created_at: str
    last_activity_at: str
    pressure: float | None  # the branch head's history over its room (``recap stats``)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "messages": self.messages,
            "tokens": self.tokens,
            "created_at": self.created_at,
            "last_activity_at": self.last_activity_at,
            "pressure": self.pressure,
        }


def conversations(
    engine: Engine,
    settings: Settings,
    *,
    idle_days: float | None = None,
    after: str | None = None,
    limit: int = 50,
    now: datetime | None = None,
) -> tuple[list[ConversationInfo], str | None]:
    """One page of conversations (id order, after the cursor ``after``), idle longer than
    ``idle_days`` when given; the cursor of the next page (None on the last)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"--limit must be between 1 and {MAX_PAGE}, got {limit}")
    if idle_days is not None and idle_days < 0:
        raise InputError(f"--idle-days must not be negative, got {idle_days:g}")
    idle_before = None
    if idle_days is not None:
        idle_before = (now or utcnow()) - timedelta(days=idle_days)
    rows, following = erase.list_conversations(
        engine, after=after, limit=limit, idle_before=idle_before
    )
    return [_info(engine, settings, row) for row in rows], following


def _info(engine: Engine, settings: Settings, row: erase.ConversationRow) -> ConversationInfo:
    pressure: float | None = None
    if row.messages:
        try:
            pressure = conversation_stats(engine, row.id, settings).pressure
        except NotFoundError:  # deleted since the page was read
            pressure = None
    return ConversationInfo(
        id=row.id,
        model=row.model,
        messages=row.messages,
        tokens=row.tokens,
        created_at=row.created_at.isoformat() if row.created_at else "",
        last_activity_at=row.last_activity_at.isoformat() if row.last_activity_at else "",
        pressure=pressure,
    )


# --- the timeline --------------------------------------------------------------------------------


def timeline(
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    *,
    leaf: int | None = None,
    as_of: datetime | None = None,
) -> timelines.Timeline:
    """Each message of the branch ending at ``leaf`` with its state in the request now (or as
    of ``as_of``), and each summary with its span (``core.request.timeline``).

    The request is ``assemble``'s own, writing nothing, with as much of the budget kept free as
    the host's last request spent beside the stored system prompt (tools, reminder, context
    files, its own system prompt): the timeline is not given those parts, only their sizes."""
    with session_scope(engine) as session:
        if as_of is not None and leaf is None:
            leaf = reads.leaf_at(session, conversation_id, _utc(as_of))
        whole = reads.load_whole_branch(session, conversation_id, leaf)
        whole, _ = attaching.expand_loaded(session.connection(), conversation_id, whole)
        merged = attachments.merges_of(session.connection(), conversation_id)
        moment = _utc(as_of) if as_of is not None else None
        summaries = compressed.load_summaries(session, conversation_id, moment)
        clearings = compressed.load_clearings(session, conversation_id, moment)
        pinned = pins.load_pins(session.connection(), conversation_id, moment)
        profile = profiles.load_profile(session.connection(), conversation_id)
    reserve = _host_parts(profile, whole.branch)
    request = service.assemble(
        engine,
        conversation_id,
        settings,
        RequestSpec(as_of=as_of),
        leaf=leaf,
        record=False,
        reserve_tokens=reserve,
    )
    head = whole.branch[-1].id if whole.branch else leaf
    reading = profile.reading if profile is not None else None
    on_branch = {m.id for m in whole.branch}
    derived = timelines.derive(
        whole.branch,
        request,
        summaries=summaries,
        clearings=clearings,
        pinned=pinned,
        refs={m.id: message_ref(m.id) for m in whole.branch},
        summary_refs={s.id: span_ref(s.cutoff_message_id) for s in summaries},
    )
    merges = [m.as_dict() for m in merged if m.instruction_id in on_branch]
    sent = profile.sent if profile is not None else None
    planned = budgets.calibration_factor(  # as the request's budget was planned (its mix)
        reading, leaf_id=head, now=utcnow(), composition=sent.composition if sent else None
    )
    return dataclasses.replace(derived, merges=merges).in_provider_tokens(planned)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _host_parts(profile: profiles.Profile | None, branch: list[Msg]) -> int:
    """Tokens the host's last request spent beside the stored history and prompt."""
    if profile is None or profile.parts is None:
        return 0
    parts = profile.parts
    root = stored_prompt(branch)
    own_system = max(parts.system - (root.tokens if root is not None else 0), 0)
    return parts.tools + parts.reminder + parts.context + own_system
