"""The compaction log: one row per run that did something, and a bounded trace of skips.

Runs that did something (``cleared``, ``summarized``), failures (``failed``) and retries
(``retry``) are what an operator reads, and what the failure cooldown reads (the failed runs since
the last summary); each gets a row of its own. Most runs, though, skip (a host enqueues after
every turn, and most turns need nothing), so ``record_run`` writes a skip that follows a skip of
the same conversation onto that row (not a run overtaken by another run's summary, which keeps
its own): ``repeats`` counts the runs it stands for, ``last_seen_at`` is the latest one's time,
and its reason, tokens and task are the latest one's (``created_at`` stays the first's). A
conversation's log grows with what was done to it, not with its turns.

Old rows are pruned on a schedule (``recap.prune_compaction_log``, every
``RECAP_LOG_PRUNE_SECONDS``):

- ``skipped`` rows last seen before ``RECAP_LOG_RETENTION_DAYS`` (default 3) are deleted;
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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, insert, select, update
from sqlalchemy import select as sa_select
from sqlmodel import Session

from recap.core.storage.db import write_scope
from recap.core.storage.models import CompactionLog, table_of
from recap.core.storage.store import as_utc
from recap.core.values.actions import SETTLING, Action

LOG = table_of(CompactionLog)
SKIPPED = Action.SKIPPED
PRUNE_BATCH = 5_000  # rows looked at per transaction: a few ms, a short write lock on SQLite
PRUNE_MAX_BATCHES = 20  # batches per run; a larger backlog continues in the next run

# What a merged skip takes from the latest run (the rest, created_at first, stays the first's).
LATEST_RUN_FIELDS = (
    "task_id",
    "trigger",
    "leaf_message_id",
    "reason",
    "tokens_before",
    "tokens_after",
    "duration_ms",
)
_LATEST = (
    select(LOG.c.id, LOG.c.action, LOG.c.summary_id)
    .where(LOG.c.conversation_id == bindparam("conversation_id"))
    .order_by(LOG.c.id.desc())
    .limit(1)
)
_ROWS_AFTER = (
    select(LOG.c.id, LOG.c.action, LOG.c.created_at, LOG.c.last_seen_at)
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


def doomed(
    action: str, created_at: datetime, at: Cuts, last_seen_at: datetime | None = None
) -> bool:
    """Whether a row with this action and time is past its retention (a streak of skips by
    its latest run's time)."""
    latest = max(created_at, last_seen_at) if last_seen_at is not None else created_at
    return created_at < at.all_before or (action == SKIPPED and latest < at.skipped_before)


def plain_skip(action: str, summary_id: int | None) -> bool:
    """A run that found nothing to do; not one that found its summary written by another run
    (a skip naming that summary), which keeps a row of its own."""
    return action == SKIPPED and summary_id is None


def record_run(connection: Connection, values: dict[str, Any]) -> None:
    """Write one run's row (``values``: the columns of a new row), or, for a skip that follows a
    skip of the same conversation, count it on that row. Call it in the run's write transaction,
    under the conversation's lease, so that no other run of it writes between the read and the
    write."""
    if plain_skip(values["action"], values.get("summary_id")):
        latest = connection.execute(_LATEST, {"conversation_id": values["conversation_id"]}).first()
        if latest is not None and plain_skip(latest.action, latest.summary_id):
            merged = {name: values[name] for name in LATEST_RUN_FIELDS if name in values}
            statement = (
                update(LOG)
                .where(LOG.c.id == latest.id)
                .values(repeats=LOG.c.repeats + 1, last_seen_at=values["created_at"], **merged)
            )
            connection.execute(statement)
            return
    connection.execute(insert(LOG).values(**values))


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
    with write_scope(engine) as session:
        connection = session.connection()
        rows = connection.execute(_ROWS_AFTER, {"after_id": after_id, "batch": batch}).all()
        doomed_ids: list[int] = []
        last = after_id
        for row_id, action, created_at, last_seen_at in rows:
            moment = as_utc(created_at)
            if moment is not None and moment >= at.skipped_before:
                return _done(connection, doomed_ids, last, examined=len(rows), more=False)
            if moment is not None and doomed(str(action), moment, at, as_utc(last_seen_at)):
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


# --- failed runs ---------------------------------------------------------------------------------

FAILED_RUNS_LIMIT = 1_000  # one screen of an operator's list; more means a wider outage to fix
# Runs after a failure that settle it: the conversation was brought under its trigger since.
SETTLING_ACTIONS = SETTLING


@dataclass(frozen=True, kw_only=True)
class FailedRun:
    """The latest failed compression run of a conversation, as an operator lists it."""

    conversation_id: str
    at: datetime
    reason: str
    attempts: int  # model attempts of that run's task: its retries plus the last one
    task_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "at": self.at.isoformat(),
            "reason": self.reason,
            "attempts": self.attempts,
            "task_id": self.task_id,
        }


def failed_runs(
    session: Session,
    *,
    since: datetime,
    conversation_ids: Sequence[str] | None = None,
    limit: int = FAILED_RUNS_LIMIT,
) -> list[FailedRun]:
    """Conversations whose latest failed run is at or after ``since`` and that no later run
    summarized or cleared: that run of each, newest first."""
    log = table_of(CompactionLog)
    run, later, retry = log.alias("run"), log.alias("later"), log.alias("retry")
    settled = sa_select(later.c.id).where(
        later.c.conversation_id == run.c.conversation_id,
        later.c.id > run.c.id,
        later.c.action.in_(SETTLING_ACTIONS),
    )
    retries = (
        sa_select(func.count())
        .where(
            retry.c.conversation_id == run.c.conversation_id,
            retry.c.task_id == run.c.task_id,
            retry.c.action == Action.RETRY,
        )
        .scalar_subquery()
    )
    statement = (
        sa_select(run.c.conversation_id, run.c.created_at, run.c.reason, run.c.task_id, retries)
        .where(run.c.action == Action.FAILED, run.c.created_at >= since, ~settled.exists())
        .order_by(run.c.created_at.desc(), run.c.id.desc())
        .limit(limit)
    )
    if conversation_ids is not None:
        statement = statement.where(run.c.conversation_id.in_(list(conversation_ids)))
    return [
        FailedRun(
            conversation_id=str(cid),
            at=as_utc(at) or at,
            reason=str(reason),
            attempts=int(count) + 1,
            task_id=task_id,
        )
        for cid, at, reason, task_id, count in session.connection().execute(statement)
    ]
