"""The operator's maintenance, run now (``recap sweep``, ``cleanup``, ``prune-log``, ``recount``,
``failures``, ``retry``): the beat's passes over every batch, each batch in its own short
transaction, and the reads the failure commands list. The beat tasks run the same storage passes
a batch at a time (``workers.maintenance``); these run them to the end."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import Engine

from recap.core.settings import Settings
from recap.core.storage import recount as recounts
from recap.core.storage.compaction_log import FailedRun, Pruned
from recap.core.storage.compaction_log import failed_runs as failed_since
from recap.core.storage.compaction_log import prune_log as prune
from recap.core.storage.db import session_scope
from recap.core.storage.models import utcnow
from recap.core.storage.outputs import CleanupResult, cleanup_outputs
from recap.core.storage.recount import Recount
from recap.core.storage.store import get_conversation
from recap.core.storage.sweep import SweepResult, sweep_idle


def sweep(engine: Engine, settings: Settings, *, idle_minutes: float | None = None) -> SweepResult:
    """Clear old tool results of idle conversations now, every batch (``idle_minutes``: the idle
    time before clearing, ``RECAP_IDLE_MINUTES`` when None; 0 clears now)."""
    return sweep_idle(engine, settings, now=utcnow(), idle_minutes=idle_minutes)


def cleanup(settings: Settings, *, retention_days: float | None = None) -> CleanupResult:
    """Delete saved tool outputs last written before the retention (``retention_days``, else
    ``RECAP_OUTPUT_RETENTION_DAYS``)."""
    days = settings.output_retention_days if retention_days is None else retention_days
    return cleanup_outputs(settings.output_dir, now=time.time(), retention_days=days)


def prune_log(engine: Engine, settings: Settings) -> Pruned:
    """Delete the compaction-log rows past ``RECAP_LOG_RETENTION_DAYS`` (skipped runs) and
    ``RECAP_LOG_HISTORY_DAYS`` (every run), every batch."""
    return prune(
        engine,
        now=utcnow(),
        retention_days=settings.log_retention_days,
        history_days=settings.log_history_days,
        max_batches=None,
    )


def recount(
    engine: Engine,
    conversation_id: str,
    *,
    model: str | None = None,
    max_input_tokens: int | None = None,
) -> Recount:
    """Recount the conversation's stored token counts made for another model, in batches; with
    ``model``, record first that the conversation now uses it (and ``max_input_tokens``)."""
    if model is not None:
        recounts.set_model(engine, conversation_id, model, max_input_tokens=max_input_tokens)
    return recounts.recount_conversation(engine, conversation_id)


def failed_runs(
    engine: Engine, *, within: timedelta, conversation_ids: Sequence[str] | None = None
) -> list[FailedRun]:
    """The conversations whose latest failed run is within ``within`` of now and that no later
    run settled: that run of each, newest first."""
    moment = utcnow() - within
    with session_scope(engine) as session:
        return failed_since(session, since=moment, conversation_ids=conversation_ids)


def require_conversations(engine: Engine, conversation_ids: Sequence[str]) -> None:
    """A ``NotFoundError`` naming the first id that is no stored conversation."""
    with session_scope(engine) as session:
        for conversation_id in conversation_ids:
            get_conversation(session, conversation_id)
