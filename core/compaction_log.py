"""The compaction log's retention: what operators need is kept, the trace of skips is bounded.

Every ``compress_session`` run writes one ``compaction_log`` row. Runs that did something
(``cleared``, ``summarized``), failures (``failed``) and retries (``retry``) are what an operator
reads, and what the failure cooldown reads (the failed runs since the last summary); most rows,
though, are ``skipped`` runs (a host enqueues after every turn, and most turns need nothing). So:

- ``skipped`` rows older than ``RECAP_LOG_RETENTION_DAYS`` (default 3) are deleted;
- every row older than ``RECAP_LOG_HISTORY_DAYS`` (default 90, never less than the first) is
  deleted.

Deleting by age from the oldest keeps the cooldown correct: it reads failed and summarized rows
newest first and stops at the first summary, so removing every row older than a moment never
makes an older failure look recent; skipped rows it never reads. Reconcile reads the
conversation's ``last_compacted_at``, not the log.

``prune_log`` walks the table by id (its primary key), oldest first, one short transaction per
batch, and stops at the first row newer than the skip cut (ids follow insertion, so the rest are
newer still); a run that reached its batch limit says so with ``more`` and its cursor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, bindparam, delete, select

from core.db import session_scope
from core.models import CompactionLog, table_of
from core.store import as_utc

LOG = table_of(CompactionLog)
SKIPPED = "skipped"
PRUNE_BATCH = 5_000  # rows looked at per transaction: a few ms, a short write lock on SQLite
PRUNE_MAX_BATCHES = 20  # batches per run; a larger backlog continues in the next run

_ROWS_AFTER = (
    select(LOG.c.id, LOG.c.action, LOG.c.created_at)
    .where(LOG.c.id > bindparam("after_id"))
    .order_by(LOG.c.id)
    .limit(bindparam("batch"))
)
_DELETE_IDS = delete(LOG).where(LOG.c.id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True, slots=True)
class Cuts:
    """The moments before which rows go: skipped rows, and every row."""

    skipped_before: datetime
    all_before: datetime


def cuts(now: datetime, *, retention_days: float, history_days: float) -> Cuts:
    """The two cuts for ``now``; the history is never shorter than the skip retention."""
    history = max(history_days, retention_days)
    return Cuts(now - timedelta(days=retention_days), now - timedelta(days=history))


def doomed(action: str, created_at: datetime, at: Cuts) -> bool:
    """Whether a row with this action and time is past its retention."""
    return created_at < at.all_before or (action == SKIPPED and created_at < at.skipped_before)


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune did: rows looked at and deleted, the last id looked at, whether more is left."""

    examined: int
    deleted: int
    last_id: int
    more: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``recap prune-log --json`` and the task."""
        return {
            "examined": self.examined,
            "deleted": self.deleted,
            "last_id": self.last_id,
            "more": self.more,
        }


def prune_batch(engine: Engine, at: Cuts, *, after_id: int, batch: int) -> Pruned:
    """One batch, in one transaction: the rows after ``after_id`` up to the first one newer than
    the skip cut, those past their retention deleted."""
    with session_scope(engine) as session:
        connection = session.connection()
        rows = connection.execute(_ROWS_AFTER, {"after_id": after_id, "batch": batch}).all()
        doomed_ids: list[int] = []
        last = after_id
        for row_id, action, created_at in rows:
            moment = as_utc(created_at)
            if moment is not None and moment >= at.skipped_before:
                return _done(connection, doomed_ids, last, examined=len(rows), more=False)
            if moment is not None and doomed(str(action), moment, at):
                doomed_ids.append(int(row_id))
            last = int(row_id)
        return _done(connection, doomed_ids, last, examined=len(rows), more=len(rows) == batch)


def _done(connection: Any, ids: list[int], last: int, *, examined: int, more: bool) -> Pruned:
    if ids:
        connection.execute(_DELETE_IDS, {"ids": ids})
    return Pruned(examined, len(ids), last, more)


def prune_log(
    engine: Engine,
    *,
    now: datetime,
    retention_days: float,
    history_days: float,
    after_id: int = 0,
    batch: int = PRUNE_BATCH,
    max_batches: int | None = PRUNE_MAX_BATCHES,
) -> Pruned:
    """Delete the log rows past their retention, batch by batch from ``after_id`` on."""
    at = cuts(now, retention_days=retention_days, history_days=history_days)
    examined = deleted = done = 0
    last, more = after_id, True
    while more and (max_batches is None or done < max_batches):
        step = prune_batch(engine, at, after_id=last, batch=batch)
        examined, deleted = examined + step.examined, deleted + step.deleted
        last, more, done = step.last_id, step.more, done + 1
    return Pruned(examined, deleted, last, more)
