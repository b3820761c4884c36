"""Writing clearings: one conversation's plan, or every idle conversation in set-based batches.

``apply_clearings`` records a ``core.decision.toolresults`` plan (the compression run's first step).
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
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import (
    DateTime,
    Engine,
    Integer,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session

from recap.core.counting.tokens import TOKENS_PER_NAME
from recap.core.decision.policy import Knobs
from recap.core.decision.toolresults import DIGIT_RUN_BOUNDS, IDLE, placeholder_base_tokens
from recap.core.errors import InputError
from recap.core.request.placeholders import DEFAULT_TOOL_NAME
from recap.core.settings import Settings
from recap.core.storage.db import without_jit, write_scope
from recap.core.storage.models import CLEARINGS, CONVERSATIONS, MESSAGES, PINS, SUMMARIES, utcnow
from recap.core.values.clearing import ClearingPlan, describe_steps
from recap.core.values.records import AGED, ARGUMENTS, CLEARED, STAGES

# The tool role as an SQL literal, the words of the partial index of tool results
# (``core.storage.models.TOOL_ONLY``): a bound parameter would keep either database from using it.
TOOL_ROLE = literal_column("'tool'", String)
INSERT_CHUNK = 500  # rows per multi-row insert: far below SQLite's bound-parameter limit
UNIQUE_KEY = ["conversation_id", "message_id", "stage"]  # a step is recorded once (Clearing)


class Applied(NamedTuple):
    """What a write recorded: results newly cleared, the tokens the new steps save, results
    newly aged and calls whose arguments were newly shortened."""

    cleared: int
    tokens_reclaimed: int
    aged: int = 0
    arguments: int = 0

    @property
    def steps(self) -> int:
        """Rows written, every stage."""
        return self.cleared + self.aged + self.arguments

    def describe(self) -> str:
        """What was written, every stage counted apart (the run's reason)."""
        return describe_steps(self.cleared, self.aged, self.arguments, self.tokens_reclaimed)


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
    """Record a plan's steps; a step already recorded (the same message and stage) is left as
    it is (idempotent, and one-way: a row is never changed), and so are messages pinned since
    the plan was made (a pin is never aged or cleared)."""
    if not plan:
        return Applied(0, 0)
    pinned = {
        int(row[0])
        for row in session.execute(
            select(PINS.c.message_id).where(
                PINS.c.conversation_id == conversation_id,
                PINS.c.message_id.in_(plan.message_ids),
            )
        )
    }
    if pinned:
        kept = tuple(item for item in plan.items if item.message_id not in pinned)
        plan = ClearingPlan(plan.reason, kept)
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
            "stage": item.stage,
            "kept_chars": item.kept_chars,
        }
        for item in plan.items
    ]
    saves = {(item.message_id, item.stage): item.saves for item in plan.items}
    counts = dict.fromkeys(STAGES, 0)
    reclaimed = 0
    for start in range(0, len(rows), INSERT_CHUNK):
        statement = (
            _insert(session)
            .values(rows[start : start + INSERT_CHUNK])
            .on_conflict_do_nothing(index_elements=UNIQUE_KEY)
            .returning(CLEARINGS.c.message_id, CLEARINGS.c.stage)
        )
        for message_id, stage in session.execute(statement):
            counts[stage] += 1
            reclaimed += saves[(int(message_id), stage)]
    return Applied(counts[CLEARED], reclaimed, counts[AGED], counts[ARGUMENTS])


# --- the idle sweep ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class SweepBatch:
    """One batch of the sweep: what it cleared, the last result it looked at, whether more are
    left to look at."""

    cleared: int = 0
    tokens_reclaimed: int = 0
    conversation_ids: set[str] = field(default_factory=set)
    last_message_id: int = 0
    more: bool = False
    per_conversation: dict[str, int] = field(default_factory=dict)  # results cleared

    def count(self, conversation_id: str, cleared: int, reclaimed: int) -> None:
        """Add what a statement reported for a conversation (negative: rows taken back)."""
        self.cleared += cleared
        self.tokens_reclaimed += reclaimed
        self.per_conversation[conversation_id] = (
            self.per_conversation.get(conversation_id, 0) + cleared
        )


def reclaimed_sql(m: Any) -> ColumnElement[int]:
    """``core.decision.toolresults.placeholder_tokens_bound`` as an SQL expression over a message
    row, so the sweep records exactly what the per-conversation plan would: stored tokens minus the
    bound. (A tool message always has its call id; the import refuses one without.)
    """
    base = case(
        (m.c.output_path.is_(None), placeholder_base_tokens(False)),
        else_=placeholder_base_tokens(True) + func.length(m.c.output_path),
    )
    name_part = case(
        (m.c.name != "", TOKENS_PER_NAME + 2 * func.length(m.c.name)),
        else_=len(DEFAULT_TOOL_NAME),
    )
    digits = case(
        *[(m.c.tokens < bound, runs) for runs, bound in enumerate(DIGIT_RUN_BOUNDS, start=1)],
        else_=len(DIGIT_RUN_BOUNDS) + 1,
    )
    bound = base + name_part + digits + 2 * func.length(m.c.tool_call_id)
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
    """Clear the eligible results among the next ``batch_size`` tool results (message id above
    ``after_id``) of every conversation idle longer than ``idle_minutes``.

    Two statements: one finds where the window of ``batch_size`` results ends, one set-based
    ``INSERT ... SELECT`` clears what is eligible inside it, working out each conversation's
    thresholds once. Eligible, as in ``core.decision.toolresults.plan_clearings`` (its ``cleared``
    stage, ``policy.idle_clearing``): a tool result not already cleared (an aged one is), not of a
    protected tool (a result without a tool name is left alone while
    any tool is protected), older than its conversation's last ``keep_last`` results, after the
    conversation's latest summary cutoff, not pinned, and larger than its placeholder (than its
    aged form too, for an aged result). Recency is by message id across the whole conversation,
    so on a branched conversation the newest branch's results are the ones kept.
    """
    window = (
        select(MESSAGES.c.id)
        .where(MESSAGES.c.role == TOOL_ROLE, MESSAGES.c.id > after_id)
        .order_by(MESSAGES.c.id)
        .limit(batch_size)
        .subquery()
    )
    without_jit(session)
    seen = session.execute(select(func.count(), func.max(window.c.id))).one()
    batch = SweepBatch(last_message_id=int(seen[1] or after_id), more=int(seen[0]) >= batch_size)
    if not seen[0]:
        return batch
    shielded = sorted({name.lower() for name in protected})
    statement = _sweep_statement(session.get_bind().dialect.name, keep_last, bool(shielded))
    values: dict[str, Any] = {
        "after_id": after_id,
        "until_id": batch.last_message_id,
        "idle_before": now - timedelta(minutes=idle_minutes),
        "now": now,
    }
    if shielded:
        values["protected"] = shielded
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        # the insert reports what it wrote (a data-modifying CTE, grouped in SQL), with the
        # incarnation of each conversation as its snapshot saw it
        seen_as: dict[str, str] = {}
        for conversation_id, incarnation, cleared, reclaimed in session.execute(statement, values):
            batch.count(str(conversation_id), int(cleared), int(reclaimed))
            seen_as[str(conversation_id)] = str(incarnation)
        # READ COMMITTED: the insert's rows come from its snapshot, its foreign-key check from what
        # is committed when each row goes in; a conversation deleted and created again between the
        # two would keep rows naming the erased one's messages. Once a row is in, the conversation
        # is locked until this transaction ends, so a fresh snapshot finds such a conversation by
        # its new incarnation, and what was filed under it is taken back.
        reborn = _reborn(session, seen_as)
        if reborn:
            strays = {k: values[k] for k in ("after_id", "until_id", "now")}
            for conversation_id, reclaimed in session.execute(
                _strays_statement(), {**strays, "reborn": reborn}
            ):
                batch.count(str(conversation_id), -1, -int(reclaimed))
        batch.conversation_ids = {c for c, n in batch.per_conversation.items() if n > 0}
        return batch
    session.execute(statement, values)
    # what this batch inserted: its window, its timestamp (counted in SQL, not row by row), read
    # by the conversations with results in the window (the unique index's first column, so each
    # is a range of the index, not a scan of the table)
    k = CLEARINGS.c
    in_window = select(MESSAGES.c.conversation_id).where(
        MESSAGES.c.role == TOOL_ROLE,
        MESSAGES.c.id > after_id,
        MESSAGES.c.id <= batch.last_message_id,
    )
    inserted = (
        select(k.conversation_id, func.count(), func.sum(_saving_beyond_aged(CLEARINGS)))
        .where(
            k.conversation_id.in_(in_window),
            k.message_id > after_id,
            k.message_id <= batch.last_message_id,
            k.reason == IDLE,
            k.stage == CLEARED,
            k.created_at == now,
        )
        .group_by(k.conversation_id)
    )
    for conversation_id, cleared, reclaimed in session.execute(inserted):
        batch.count(str(conversation_id), int(cleared), int(reclaimed))
    batch.conversation_ids = set(batch.per_conversation)
    return batch


def _reborn(session: Session, seen_as: dict[str, str]) -> list[str]:
    """The conversations whose incarnation is no longer the one the batch's snapshot saw (one
    primary-key lookup each, on a fresh snapshot)."""
    if not seen_as:
        return []
    rows = session.execute(
        select(CONVERSATIONS.c.id, CONVERSATIONS.c.incarnation).where(
            CONVERSATIONS.c.id.in_(sorted(seen_as))
        )
    )
    now_as = {str(cid): str(incarnation) for cid, incarnation in rows}
    return sorted(cid for cid, incarnation in seen_as.items() if now_as.get(cid) != incarnation)


@lru_cache(maxsize=1)
def _strays_statement() -> Any:
    """Remove what this batch filed under a conversation created again while the batch's insert
    ran (``reborn``) that the conversation does not hold: the erased one's messages."""
    k = CLEARINGS
    holds = select(MESSAGES.c.id).where(
        MESSAGES.c.id == k.c.message_id, MESSAGES.c.conversation_id == k.c.conversation_id
    )
    return (
        delete(k)
        .where(
            k.c.conversation_id.in_(bindparam("reborn", expanding=True)),
            k.c.message_id > bindparam("after_id", type_=Integer),
            k.c.message_id <= bindparam("until_id", type_=Integer),
            k.c.reason == IDLE,
            k.c.stage == CLEARED,
            k.c.created_at == bindparam("now", type_=DateTime(timezone=True)),
            ~holds.exists(),
        )
        .returning(k.c.conversation_id, _saving_beyond_aged(k))
    )


def _saving_beyond_aged(clearings: Any) -> Any:
    """What a ``cleared`` row saves beyond the message's aged form (an aged result cleared
    saves only what its placeholder saves beyond it): the batch's reported saving."""
    return clearings.c.tokens_reclaimed - func.coalesce(
        _aged_saving(clearings.c.conversation_id, clearings.c.message_id), 0
    )


def _aged_saving(conversation_id: Any, message_id: Any) -> Any:
    """What the aged row of a message saves for the conversation (NULL when it is not aged):
    one probe of the clearings' unique index (conversation, message, stage)."""
    aged = CLEARINGS.alias("aged")
    return (
        select(aged.c.tokens_reclaimed)
        .where(
            aged.c.conversation_id == conversation_id,
            aged.c.message_id == message_id,
            aged.c.stage == AGED,
        )
        .correlate_except(aged)  # to the row it is asked for, in a RETURNING clause too
        .scalar_subquery()
    )


def _steps_taken(conversation_id: Any, message_id: Any) -> Any:
    """What the steps recorded for a message save for the conversation: NULL once it is
    cleared, else what its aged row saves (0 without one). One probe of the clearings' unique
    index (conversation, message, stage) for both questions; a probe by message alone would
    scan the table (quadratic in an idle sweep)."""
    k = CLEARINGS.alias("taken")
    is_cleared = func.max(case((k.c.stage == CLEARED, 1), else_=0))
    aged = func.sum(case((k.c.stage == AGED, k.c.tokens_reclaimed), else_=0))
    return (
        select(case((is_cleared == 1, literal(None, Integer)), else_=func.coalesce(aged, 0)))
        .where(k.c.conversation_id == conversation_id, k.c.message_id == message_id)
        .scalar_subquery()
    )


@lru_cache(maxsize=16)
def _sweep_statement(dialect: str, keep_last: int, has_protected: bool) -> Any:
    """The sweep's ``INSERT ... SELECT``, built once per shape; the rest are bound parameters."""
    m, newer, inside = MESSAGES.alias("m"), MESSAGES.alias("newer"), MESSAGES.alias("inside")
    c, summaries = CONVERSATIONS.alias("c"), SUMMARIES.alias("s")
    after = bindparam("after_id", type_=Integer)
    until = bindparam("until_id", type_=Integer)
    in_window = select(inside.c.conversation_id).where(
        inside.c.id > after, inside.c.id <= until, inside.c.role == TOOL_ROLE
    )
    keep_before = (
        select(newer.c.id)
        .where(newer.c.conversation_id == c.c.id, newer.c.role == "tool")
        .order_by(newer.c.id.desc())
        .limit(1)
        .offset(keep_last - 1)
        .scalar_subquery()
        if keep_last > 0
        else literal(None, Integer)
    )
    covered = func.coalesce(
        select(func.max(summaries.c.cutoff_message_id))
        .where(summaries.c.conversation_id == c.c.id)
        .scalar_subquery(),
        0,
    )
    # one row per idle conversation with results in the window, its thresholds worked out once
    idle = (
        select(
            c.c.id.label("cid"),
            c.c.incarnation,
            keep_before.label("keep_before"),
            covered.label("covered"),
        )
        .where(
            c.c.last_activity_at < bindparam("idle_before", type_=DateTime(timezone=True)),
            c.c.id.in_(in_window),
        )
        .cte("idle")
        .prefix_with("MATERIALIZED")
    )
    reclaimed = reclaimed_sql(m)
    conditions = [
        m.c.id > after,
        m.c.id <= until,
        m.c.role == TOOL_ROLE,
        m.c.id > idle.c.covered,
        # the step must save tokens: against the stored count, or an aged result's aged form;
        # a result already cleared is skipped (NULL), not left to a conflicting insert (which
        # stays, for a result cleared meanwhile by another run)
        reclaimed - _steps_taken(m.c.conversation_id, m.c.id) > 0,
        # a pinned result is sent as stored (core.request.pins): one probe of the pins' index
        ~select(PINS.c.message_id).where(PINS.c.message_id == m.c.id).exists(),
    ]
    if keep_last > 0:
        conditions.append(m.c.id < idle.c.keep_before)
    if has_protected:
        names: Any = bindparam("protected", expanding=True)
        conditions.append(and_(m.c.name.is_not(None), func.lower(m.c.name).not_in(names)))
    candidates = (
        select(
            m.c.conversation_id,
            m.c.id,
            literal(IDLE, String),
            reclaimed,
            bindparam("now", type_=DateTime(timezone=True)),
            literal(CLEARED, String),
        )
        .select_from(m.join(idle, idle.c.cid == m.c.conversation_id))
        .where(*conditions)
    )
    insert_ = postgresql.insert(CLEARINGS) if dialect == "postgresql" else sqlite.insert(CLEARINGS)
    statement = insert_.from_select(
        ["conversation_id", "message_id", "reason", "tokens_reclaimed", "created_at", "stage"],
        candidates,
    ).on_conflict_do_nothing(index_elements=UNIQUE_KEY)
    if dialect != "postgresql":
        return statement
    # PostgreSQL: the rows the insert wrote, counted per conversation in the same statement
    written = statement.returning(
        CLEARINGS.c.conversation_id, CLEARINGS.c.message_id, CLEARINGS.c.tokens_reclaimed
    ).cte("written")
    return (
        select(
            written.c.conversation_id,
            idle.c.incarnation,
            func.count(),
            func.sum(_saving_beyond_aged(written)),
        )
        .select_from(written.join(idle, idle.c.cid == written.c.conversation_id))
        .group_by(written.c.conversation_id, idle.c.incarnation)
    )


@dataclass(kw_only=True)
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
    knobs = Knobs.from_settings(settings)  # the decision's own knobs (``policy.idle_clearing``)
    seen: set[str] = set()
    while max_batches is None or result.batches < max_batches:
        for attempt in range(2):  # a conversation deleted under the batch fails its insert once
            try:
                with write_scope(engine) as session:
                    batch = sweep_batch(
                        session,
                        now=now,
                        idle_minutes=knobs.idle_minutes if idle_minutes is None else idle_minutes,
                        keep_last=knobs.idle_keep_tool_results,
                        protected=knobs.protected_tools,
                        batch_size=settings.sweep_batch_size,
                        after_id=result.last_message_id,
                    )
                break
            except IntegrityError:
                if attempt:
                    raise
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
