"""The web console's reads (``workers.ui``, through ``core.service.console``): the conversations
list, paginated in the database, and the rows one conversation's page shows beside its branch
(the compaction log, provider readings, when messages, summaries and clearings were written, the
branches to switch between); the values they return are ``core.values.console``'s.

Reads only. The list is two statements: the page's ids (filtered, sorted and cut by the database,
so a page costs about the same among ten conversations and ten thousand), then the figures of
those ids alone (message counts and stored tokens from the index on (conversation, id, parent),
the latest run, the failures). Nothing here loads every row of a table.

Pressure is not stored: it changes with every message. Sorting by it works it out in SQL for each
conversation the filter keeps, from what is stored (``_pressure_sql``): the history after the
latest summary's cutoff (the summary, the messages after it less their clearings, the pinned
messages it covers) over the room the budget leaves (the window less the safety margin, the
output reserve and the fixed parts the host last sent), both scaled by the latest provider
reading's calibration with its age and distance weights (``core.counting.budget``). That is
``recap stats``'s pressure, to rounding, for a conversation that never forked; a forked one
counts every branch after the cutoff. The page's own figures are then ``recap stats``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    DateTime,
    Float,
    bindparam,
    case,
    cast,
    extract,
    func,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.sql import ColumnElement

from recap.core.counting import budget as budgets
from recap.core.counting.tokens import CALIBRATION_MAX, CALIBRATION_MIN
from recap.core.storage.models import (
    CLEARINGS,
    CONVERSATIONS,
    MESSAGES,
    PINS,
    REQUEST_PROFILES,
    SUMMARIES,
    CompactionLog,
    Usage,
    table_of,
    utcnow,
)
from recap.core.storage.store import as_utc
from recap.core.values.actions import Action
from recap.core.values.console import (
    SORTS,
    ConversationRow,
    Page,
    PressureInputs,
    Reading,
    Run,
)
from recap.core.values.records import SYSTEM_ROLES

LOG = table_of(CompactionLog)
USAGE = table_of(Usage)
C, M, L = CONVERSATIONS.c, MESSAGES.c, LOG.c

FAILED = Action.FAILED
PROMPT_ROLES = SYSTEM_ROLES  # a root message of these roles is the stored prompt
MODELS_MAX = 500  # distinct models a pressure sort knows windows for (the rest sort last)
NO_ROOM = 1e12  # the pressure of a conversation whose fixed parts leave its history no room
PAGE_SIZE_MAX = 200  # rows one page may ask for
SEARCH_CHARS_MAX = 255  # a conversation id is at most this long, so a longer search finds nothing
LOG_ROWS = 200  # compaction-log rows one conversation page shows, newest first
USAGE_ROWS = 2_000  # provider readings one conversation page charts, newest first
BRANCHES_MAX = 50  # branch heads one conversation page offers


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
    pressure: PressureInputs | None = None,
) -> Page:
    """One page of conversations whose id contains ``search`` (any case); with ``scoped``, only
    those ``owner`` created. ``sort`` is one of ``SORTS`` (``pressure`` needs ``pressure``'s
    inputs; conversations of an unknown window sort last either way); ties are broken by id."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    limit = max(1, min(limit, PAGE_SIZE_MAX))
    where = _filters(search, owner, scoped)
    if sort == "pressure":
        if pressure is None:
            raise ValueError("the pressure sort needs the budget's inputs")
        return _by_pressure(connection, where, pressure, descending, limit, max(offset, 0))
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


def _total(connection: Connection, where: list[ColumnElement[bool]]) -> int:
    statement = select(func.count()).select_from(CONVERSATIONS).where(*where)
    return int(connection.execute(statement).scalar_one())


def _by_pressure(
    connection: Connection,
    where: list[ColumnElement[bool]],
    inputs: PressureInputs,
    descending: bool,
    limit: int,
    offset: int,
) -> Page:
    """The page sorted by the pressure worked out in SQL (``_pressure_sql``), unknown last."""
    models = [
        str(row[0])
        for row in connection.execute(
            select(C.model).where(*where).distinct().order_by(C.model).limit(MODELS_MAX)
        )
    ]
    windows = {model: inputs.window_of(model) for model in models}
    known = {model: found for model, found in windows.items() if found is not None}
    now = inputs.now or utcnow()
    dialect = connection.dialect.name
    scored = _pressure_sql(where, known, inputs, dialect).subquery("scored")
    key = scored.c.pressure
    statement = (
        select(scored.c.cid, key)
        .order_by(
            key.is_(None),
            key.desc() if descending else key.asc(),
            scored.c.cid.desc() if descending else scored.c.cid.asc(),
        )
        .limit(limit)
        .offset(offset)
    )
    moment = now.astimezone(UTC).replace(tzinfo=None) if dialect == "sqlite" else now
    found = {
        str(cid): None if value is None else float(value)
        for cid, value in connection.execute(statement, {"now": moment})
    }
    rows = _rows_of(connection, list(found))
    return Page(rows=rows, total=_total(connection, where), pressures=found)


def _within(value: Any, low: float, high: float) -> Any:
    return case((value < low, low), (value > high, high), else_=value)


def _calibration_sql(r: Any, leaf: Any, dialect: str) -> Any:
    """``core.counting.budget.calibration_factor`` in SQL over a request profile row: the
    reading's ratio, clamped, drawn back to 1 by its age (the bound ``now``) and by how far the
    newest message moved past it."""
    ratio = _within(
        cast(r.usage_prompt_tokens, Float) / r.usage_estimated_tokens,
        CALIBRATION_MIN,
        CALIBRATION_MAX,
    )
    now = bindparam("now", type_=DateTime(timezone=dialect != "sqlite"))
    if dialect == "sqlite":
        age = (func.julianday(now) - func.julianday(r.usage_at)) * 86_400.0
    else:
        age = extract("epoch", now - r.usage_at)
    fresh = budgets.CALIBRATION_FRESH.total_seconds()
    stale = budgets.CALIBRATION_STALE.total_seconds()
    age_weight = case(
        (r.usage_at.is_(None), 1.0),
        (age <= fresh, 1.0),
        else_=_within(1.0 - (age - fresh) / (stale - fresh), 0.0, 1.0),
    )
    near, far = budgets.CALIBRATION_NEAR_MESSAGES, budgets.CALIBRATION_FAR_MESSAGES
    moved = func.abs(leaf - r.usage_leaf_message_id)
    distance_weight = case(
        (r.usage_leaf_message_id.is_(None), 1.0),
        (leaf.is_(None), 1.0),
        (moved <= near, 1.0),
        else_=_within(1.0 - cast(moved - near, Float) / (far - near), 0.0, 1.0),
    )
    measured = (r.usage_estimated_tokens > 0) & (r.usage_prompt_tokens > 0)
    return case(
        (measured, 1.0 + (ratio - 1.0) * age_weight * distance_weight),
        else_=1.0,
    )


def _pressure_sql(
    where: list[ColumnElement[bool]],
    windows: dict[str, tuple[int, int]],
    inputs: PressureInputs,
    dialect: str,
) -> Any:
    """One row per conversation the filter keeps: its id and its pressure (see the module
    docstring), each figure a correlated subquery over the conversation's own index ranges."""
    s, m, k, p, r = SUMMARIES.c, M, CLEARINGS.c, PINS.c, REQUEST_PROFILES.c
    latest = select(func.max(s.cutoff_message_id)).where(s.conversation_id == C.id)
    base = (
        select(
            C.id.label("cid"),
            C.model.label("model"),
            C.max_input_tokens.label("given"),
            func.coalesce(latest.scalar_subquery(), 0).label("cutoff"),
        )
        .where(*where)
        .subquery("base")
    )
    b = base.c
    summary_tokens = (
        select(s.tokens)
        .where(s.conversation_id == b.cid, s.cutoff_message_id == b.cutoff)
        .limit(1)
        .scalar_subquery()
    )
    after = (
        select(func.coalesce(func.sum(m.tokens), 0))
        .where(m.conversation_id == b.cid, m.id > b.cutoff)
        .scalar_subquery()
    )
    is_prompt = (m.parent_id.is_(None)) & m.role.in_(PROMPT_ROLES)
    prompt = (
        select(m.tokens)
        .where(m.conversation_id == b.cid, is_prompt)
        .order_by(m.id)
        .limit(1)
        .scalar_subquery()
    )
    pinned_result = select(p.message_id).where(p.message_id == k.message_id).exists()
    reclaimed = (
        select(func.coalesce(func.sum(k.tokens_reclaimed), 0))
        .where(
            k.conversation_id == b.cid,
            k.message_id > b.cutoff,
            or_(k.reason == "reasoning", ~pinned_result),  # a pin undoes other clearings
        )
        .scalar_subquery()
    )
    pinned_span = (  # the pinned messages the summary covers: sent after it
        select(func.coalesce(func.sum(m.tokens), 0))
        .select_from(PINS.join(MESSAGES, m.id == p.message_id))
        .where(p.conversation_id == b.cid, p.message_id <= b.cutoff, ~is_prompt)
        .scalar_subquery()
    )
    prompt_tokens = func.coalesce(prompt, 0)
    history = (
        func.coalesce(summary_tokens, 0)
        + after
        - case((b.cutoff == 0, prompt_tokens), else_=0)
        - reclaimed
        + pinned_span
    )
    by_model = {model: window for model, (window, _) in windows.items()}
    reserve_by_model = {model: reserve for model, (_, reserve) in windows.items()}
    map_window = case(by_model, value=b.model, else_=null()) if by_model else null()
    map_reserve = case(reserve_by_model, value=b.model, else_=0) if reserve_by_model else 0
    window = case((b.given.is_not(None), b.given), else_=map_window)
    override = case((r.reserve_output_tokens > 0, r.reserve_output_tokens), else_=0)
    reserve = case(
        (r.reserve_output_tokens.is_not(None), override),  # the conversation's own reserve
        (b.given.is_not(None), 0),  # a window given is an input limit: no reserve
        else_=map_reserve,
    )
    parts = r.system_tokens + r.tools_tokens + r.reminder_tokens + r.context_tokens
    fixed = case(
        (r.assembled_at.is_not(None), parts),
        else_=inputs.default_fixed_tokens + prompt_tokens,
    )
    newest = select(func.max(m.id)).where(m.conversation_id == b.cid).scalar_subquery()
    factor = _calibration_sql(r, newest, dialect)
    usable = cast(window, Float) * (1 - inputs.safety_margin) - reserve
    available = usable - (fixed + inputs.priming_tokens) * factor
    pressure = case(
        (window.is_(None), null()),
        (available > 0, cast(history, Float) * factor / available),
        else_=NO_ROOM,
    )
    return select(b.cid, pressure.label("pressure")).select_from(
        base.outerjoin(REQUEST_PROFILES, r.conversation_id == b.cid)
    )


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


def has_message(connection: Connection, conversation_id: str, message_id: int) -> bool:
    """Whether ``message_id`` is a message of the conversation (message ids are unique across
    conversations, so another conversation's message is not)."""
    statement = select(M.id).where(M.id == message_id, M.conversation_id == conversation_id)
    return connection.execute(statement).first() is not None


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
