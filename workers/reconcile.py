"""Reconcile: re-enqueue what a lost message or a dead worker left behind.

A conversation is a candidate when its last run is missing (activity since it, or a dirty flag
nobody picked up) or its lease expired (the run died). A candidate is enqueued when it is dirty
or when the decision (``core.decision.policy``) would act on it; otherwise the check is noted, so
the next pass skips it until new activity. Each candidate is judged on its content-free snapshot,
and one that is far under its trigger from two aggregates alone
(``core.storage.snapshot.history_bound``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, or_, select, update

from recap.core.counting import tokens
from recap.core.decision import policy
from recap.core.settings import Settings
from recap.core.storage import snapshot as snapshots
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS, utcnow

RECONCILE_BATCH = 500  # conversations examined per reconcile pass


def reconcile(
    engine: Engine,
    settings: Settings,
    enqueue: Callable[[str], object],
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Re-enqueue conversations the decision would act on whose last run is missing or died."""
    moment = now or utcnow()
    rows = candidates(engine, moment)
    knobs = policy.Knobs.from_settings(settings)
    enqueued = 0
    for conversation_id, dirty in rows:
        if dirty or needs_run(engine, knobs, conversation_id, moment):
            enqueue(conversation_id)
            enqueued += 1
        else:
            _mark_checked(engine, conversation_id, moment)
    return {"enqueued": enqueued}


def candidates(engine: Engine, now: datetime) -> list[tuple[str, bool]]:
    """The conversations a pass examines, oldest activity first, with their dirty flags: no live
    lease, and dirty, a dead run's lease, never run, or active since their last run."""
    c = CONVERSATIONS.c
    free = or_(c.lease_owner.is_(None), c.lease_expires_at < now)
    stale = or_(
        c.dirty.is_(True),
        c.lease_owner.is_not(None),
        c.last_compacted_at.is_(None),
        c.last_compacted_at < c.last_activity_at,
    )
    statement = select(c.id, c.dirty).where(free, stale).order_by(c.last_activity_at)
    with session_scope(engine) as session:
        rows = session.connection().execute(statement.limit(RECONCILE_BATCH))
        return [(str(cid), bool(dirty)) for cid, dirty in rows]


def needs_run(engine: Engine, knobs: policy.Knobs, conversation_id: str, now: datetime) -> bool:
    """Whether a run would do anything: the decision is not a skip."""
    try:
        with session_scope(engine) as session:
            bound = snapshots.history_bound(session, conversation_id)
            if bound is not None:
                head = snapshots.head_snapshot(session, conversation_id, now=now)
                if policy.early_skip(head, knobs, bound[0]) is not None:
                    return False
            snapshot = snapshots.read_snapshot(session, conversation_id, now=now)
    except tokens.UnknownModelError:
        return False
    return policy.decide(snapshot, knobs).action != policy.SKIP


def _mark_checked(engine: Engine, conversation_id: str, now: datetime) -> None:
    """Nothing to do: note the check and drop a dead run's lease, so the next pass skips it."""
    c = CONVERSATIONS.c
    with session_scope(engine) as session:
        session.connection().execute(
            update(CONVERSATIONS)
            .where(c.id == conversation_id, or_(c.lease_owner.is_(None), c.lease_expires_at < now))
            .values(last_compacted_at=now, lease_owner=None, lease_expires_at=None)
        )
