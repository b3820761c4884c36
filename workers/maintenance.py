"""Maintenance tasks: on beat, the idle tool-result sweep, the saved-output cleanup and the
compaction-log pruning; on demand, the recount of a conversation's stored token counts.

All are thin: the work is ``core.storage.sweep.sweep_idle``,
``core.storage.outputs.cleanup_outputs``, ``core.storage.compaction_log.prune_log`` and
``core.storage.recount.recount_conversation``. A sweep, prune or recount run does a bounded number
of batches and, when more is left, re-enqueues itself from where it stopped, so a large backlog
never holds a worker (or a transaction) for long.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from recap.core.settings import get_settings
from recap.core.storage.compaction_log import PRUNE_BATCH, prune_log
from recap.core.storage.db import get_engine
from recap.core.storage.models import utcnow
from recap.core.storage.outputs import cleanup_outputs
from recap.core.storage.recount import recount_conversation
from recap.core.storage.sweep import sweep_idle
from recap.workers.app import task
from recap.workers.celery_types import TaskHandle

SWEEP_TASK = "recap.sweep_idle_tool_results"
CLEANUP_TASK = "recap.cleanup_truncated_outputs"

log = structlog.get_logger(__name__)
RECOUNT_MAX_BATCHES = 10  # batches per task run; a longer conversation continues in the next


@task(name=SWEEP_TASK, bind=True)
def sweep_idle_tool_results(
    self: TaskHandle[dict[str, Any]], after_id: int = 0, idle_minutes: float | None = None
) -> dict[str, Any]:
    """Clear one batch of old tool results of idle conversations; re-enqueue if more is left."""
    settings = get_settings()
    result = sweep_idle(
        get_engine(settings.database_url),
        settings,
        now=utcnow(),
        idle_minutes=idle_minutes,
        after_id=after_id,
        max_batches=1,
    )
    payload = result.as_dict()
    if result.more:
        arguments = {"after_id": result.last_message_id, "idle_minutes": idle_minutes}
        payload["next_task_id"] = str(self.apply_async(kwargs=arguments, **_same_queue(self)).id)
    log.info("sweep_idle_tool_results_done", after_id=after_id, **payload)
    return payload


def _same_queue(task: TaskHandle[object]) -> dict[str, Any]:
    """Send the continuation to the queue this run came from (the maintenance queue)."""
    queue = (task.request.delivery_info or {}).get("routing_key")
    return {"queue": queue} if queue else {}


@task(name=CLEANUP_TASK, bind=True)
def cleanup_truncated_outputs(
    self: TaskHandle[dict[str, Any]], retention_days: float | None = None
) -> dict[str, Any]:
    """Delete saved outputs older than the retention, inside ``RECAP_OUTPUT_DIR`` only."""
    settings = get_settings()
    days = settings.output_retention_days if retention_days is None else retention_days
    result = cleanup_outputs(settings.output_dir, now=time.time(), retention_days=days)
    log.info("cleanup_truncated_outputs_done", retention_days=days, **result.as_dict())
    return result.as_dict()


PRUNE_LOG_TASK = "recap.prune_compaction_log"
RECOUNT_TASK = "recap.recount_tokens"


@task(name=PRUNE_LOG_TASK, bind=True)
def prune_compaction_log(
    self: TaskHandle[dict[str, Any]], after_id: int = 0, batch: int = PRUNE_BATCH
) -> dict[str, Any]:
    """Delete compaction-log rows past their retention (``core.storage.compaction_log``), a bounded
    number of batches; re-enqueue from where it stopped if more is left."""
    settings = get_settings()
    result = prune_log(
        get_engine(settings.database_url),
        now=utcnow(),
        retention_days=settings.log_retention_days,
        history_days=settings.log_history_days,
        after_id=after_id,
        batch=batch,
    )
    payload = result.as_dict()
    if result.more:
        arguments = {"after_id": result.last_id, "batch": batch}
        payload["next_task_id"] = str(self.apply_async(kwargs=arguments, **_same_queue(self)).id)
    log.info("prune_compaction_log_done", after_id=after_id, **payload)
    return payload


@task(name=RECOUNT_TASK, bind=True)
def recount_tokens(
    self: TaskHandle[dict[str, Any]], conversation_id: str, after_id: int = 0
) -> dict[str, Any]:
    """Recount a conversation's stored counts made for another model (``core.storage.recount``), a
    bounded number of batches; re-enqueue from where it stopped if more is left."""
    settings = get_settings()
    result = recount_conversation(
        get_engine(settings.database_url),
        conversation_id,
        after_id=after_id,
        max_batches=RECOUNT_MAX_BATCHES,
    )
    payload = result.as_dict()
    if result.more:
        arguments = {"conversation_id": conversation_id, "after_id": result.last_message_id}
        payload["next_task_id"] = str(self.apply_async(kwargs=arguments, **_same_queue(self)).id)
    log.info("recount_tokens_done", conversation_id=conversation_id, **payload)
    return payload
