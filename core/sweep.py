"""Writing clearings: one conversation's plan, or every idle conversation in set-based batches.

``apply_clearings`` records a ``core.toolresults`` plan (the compression run's first step).
``sweep_batch`` clears, in one ``INSERT ... SELECT``, the next batch of old tool results of every
conversation idle past ``idle_minutes``: the provider's prompt cache of such a conversation has
expired, so changing its prefix costs nothing. Both insert with "on conflict do nothing": a result
is cleared once, whoever gets there first, and a clearing is never undone. Messages are never
touched, and neither is a conversation's ``last_activity_at``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    DateTime,
    Engine,
    Integer,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session

from core.db import session_scope
from core.errors import InputError
from core.models import CLEARINGS, CONVERSATIONS, MESSAGES, SUMMARIES, utcnow
from core.placeholders import DEFAULT_TOOL_NAME
from core.settings import Settings
from core.tokens import TOKENS_PER_NAME
from core.toolresults import IDLE, ClearingPlan, placeholder_base_tokens

INSERT_CHUNK = 500  # rows per multi-row insert: far below SQLite's bound-parameter limit


class Applied(NamedTuple):
    """What a write cleared: results newly cleared and the tokens they reclaim."""

    cleared: int
    tokens_reclaimed: int


def _insert(session: Session) -> Any:
    """The dialect's INSERT that can say ``ON CONFLICT DO NOTHING``."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(CLEARINGS)
    if name == "sqlite":
        return sqlite.insert(CLEARINGS)
    raise NotImplementedError(f"clearings need SQLite or PostgreSQL, not {name}")


def apply_clearings(
    session: Session, conversation_id: str, plan: ClearingPlan, *, now: datetime | None = None
) -> Applied:
    """Record a plan's clearings; results already cleared are left as they are (idempotent)."""
    if not plan:
        return Applied(0, 0)
    moment = now or utcnow()
    rows = [
        {
            "conversation_id": conversation_id,
            "message_id": item.message_id,
            "reason": plan.reason,
            "tokens_reclaimed": item.tokens_reclaimed,
            "created_at": moment,
        }
        for item in plan.items
    ]
    cleared = reclaimed = 0
    for start in range(0, len(rows), INSERT_CHUNK):
        statement = (
            _insert(session)
            .values(rows[start : start + INSERT_CHUNK])
            .on_conflict_do_nothing(index_elements=["message_id"])
            .returning(CLEARINGS.c.tokens_reclaimed)
        )
        done = session.execute(statement).scalars().all()
        cleared += len(done)
        reclaimed += sum(int(value) for value in done)
    return Applied(cleared, reclaimed)


# --- the idle sweep ----------------------------------------------------------------------------


@dataclass
class SweepBatch:
    """One batch of the sweep: what it cleared and where the next batch starts."""

    cleared: int = 0
    tokens_reclaimed: int = 0
    conversation_ids: set[str] = field(default_factory=set)
    last_message_id: int = 0
    more: bool = False


def reclaimed_sql(m: Any) -> ColumnElement[int]:
    """``core.toolresults.placeholder_tokens_bound`` as an SQL expression over a message row, so
    the sweep records exactly what the per-conversation plan would: stored tokens minus the bound.
    """
    base = case(
        (m.c.output_path.is_(None), placeholder_base_tokens(False)),
        else_=placeholder_base_tokens(True) + func.length(m.c.output_path),
    )
    named = func.coalesce(m.c.name, "") != ""
    name_part = case(
        (named, TOKENS_PER_NAME + 2 * func.length(m.c.name)),
        else_=len(DEFAULT_TOOL_NAME),
    )
    digits = (func.length(cast(m.c.tokens, String)) + 2) / 3
    call_id = 2 * func.length(func.coalesce(m.c.tool_call_id, ""))
    bound = base + name_part + cast(digits, Integer) + call_id
    return m.c.tokens - bound  # type: ignore[no-any-return]


def sweep_batch(
    session: Session,
    *,
    now: datetime,
    idle_minutes: float,
    keep_last: int,
    protected: Collection[str],
    batch_size: int,
    after_id: int = 0,
) -> SweepBatch:
    """Clear the next ``batch_size`` eligible results (message id above ``after_id``) of every
    conversation idle longer than ``idle_minutes``, in one set-based statement.

    Eligible, as in ``core.toolresults.plan_clearings``: a tool result not already cleared, not
    of a protected tool (a result without a tool name is left alone while any tool is protected),
    older than its conversation's last ``keep_last`` results, after the conversation's latest
    summary cutoff, and larger than its placeholder. Recency is by message id across the whole
    conversation, so on a branched conversation the newest branch's results are the ones kept.
    """
    m = MESSAGES.alias("m")
    newer = MESSAGES.alias("newer")
    c = CONVERSATIONS.alias("c")
    cleared = CLEARINGS.alias("k")
    summaries = SUMMARIES.alias("s")
    idle_before = now - timedelta(minutes=idle_minutes)
    reclaimed = reclaimed_sql(m)
    conditions = [
        m.c.role == "tool",
        m.c.id > after_id,
        c.c.last_activity_at < idle_before,
        reclaimed > 0,
        ~select(cleared.c.id).where(cleared.c.message_id == m.c.id).exists(),
        m.c.id
        > func.coalesce(
            select(func.max(summaries.c.cutoff_message_id))
            .where(summaries.c.conversation_id == m.c.conversation_id)
            .scalar_subquery(),
            0,
        ),
    ]
    if keep_last > 0:
        threshold = (
            select(newer.c.id)
            .where(newer.c.conversation_id == m.c.conversation_id, newer.c.role == "tool")
            .order_by(newer.c.id.desc())
            .limit(1)
            .offset(keep_last - 1)
            .scalar_subquery()
        )
        conditions.append(m.c.id < threshold)
    if protected:
        shielded = sorted({name.lower() for name in protected})
        conditions.append(and_(m.c.name.is_not(None), func.lower(m.c.name).not_in(shielded)))
    candidates = (
        select(
            m.c.conversation_id,
            m.c.id,
            literal(IDLE, String),
            reclaimed,
            literal(now, DateTime(timezone=True)),
        )
        .select_from(m.join(c, c.c.id == m.c.conversation_id))
        .where(*conditions)
        .order_by(m.c.id)
        .limit(batch_size)
    )
    statement = (
        _insert(session)
        .from_select(
            ["conversation_id", "message_id", "reason", "tokens_reclaimed", "created_at"],
            candidates,
        )
        .on_conflict_do_nothing(index_elements=["message_id"])
        .returning(
            CLEARINGS.c.conversation_id, CLEARINGS.c.message_id, CLEARINGS.c.tokens_reclaimed
        )
    )
    batch = SweepBatch(last_message_id=after_id)
    for conversation_id, message_id, tokens_reclaimed in session.execute(statement):
        batch.cleared += 1
        batch.tokens_reclaimed += int(tokens_reclaimed)
        batch.conversation_ids.add(str(conversation_id))
        batch.last_message_id = max(batch.last_message_id, int(message_id))
    batch.more = batch.cleared >= batch_size
    return batch


@dataclass
class SweepResult:
    """A whole sweep (or one task run of it), as ``recap sweep --json`` prints it."""

    cleared: int = 0
    tokens_reclaimed: int = 0
    conversations: int = 0
    batches: int = 0
    last_message_id: int = 0
    more: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "cleared": self.cleared,
            "tokens_reclaimed": self.tokens_reclaimed,
            "conversations": self.conversations,
            "batches": self.batches,
            "more": self.more,
        }


def sweep_idle(
    engine: Engine,
    settings: Settings,
    *,
    now: datetime,
    idle_minutes: float | None = None,
    after_id: int = 0,
    max_batches: int | None = None,
) -> SweepResult:
    """Run sweep batches, each in its own short transaction, until nothing is left (or after
    ``max_batches``: a task run does one and re-enqueues itself with ``last_message_id``)."""
    if idle_minutes is not None and idle_minutes < 0:
        raise InputError(f"--idle-minutes must not be negative, got {idle_minutes:g}")
    result = SweepResult(last_message_id=after_id)
    seen: set[str] = set()
    while max_batches is None or result.batches < max_batches:
        with session_scope(engine) as session:
            batch = sweep_batch(
                session,
                now=now,
                idle_minutes=settings.idle_minutes if idle_minutes is None else idle_minutes,
                keep_last=settings.keep_tool_results,
                protected=settings.protected_tools,
                batch_size=settings.sweep_batch_size,
                after_id=result.last_message_id,
            )
        result.batches += 1
        result.cleared += batch.cleared
        result.tokens_reclaimed += batch.tokens_reclaimed
        result.last_message_id = batch.last_message_id
        seen |= batch.conversation_ids
        result.more = batch.more
        if not batch.more:
            break
    result.conversations = len(seen)
    return result
