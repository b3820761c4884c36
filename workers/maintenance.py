"""Maintenance tasks on beat: the idle tool-result sweep and the saved-output cleanup.

Both are thin: the work is ``core.sweep.sweep_idle`` and ``core.outputs.cleanup_outputs``. A sweep
run clears one bounded batch and, when more is left, re-enqueues itself from where it stopped, so
a large backlog never holds a worker (or a transaction) for long.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from core.db import get_engine
from core.models import utcnow
from core.outputs import cleanup_outputs
from core.settings import get_settings
from core.sweep import sweep_idle
from workers.app import app

SWEEP_TASK = "recap.sweep_idle_tool_results"
CLEANUP_TASK = "recap.cleanup_truncated_outputs"

log = structlog.get_logger(__name__)


@app.task(name=SWEEP_TASK, bind=True)
def sweep_idle_tool_results(
    self: Any, after_id: int = 0, idle_minutes: float | None = None
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


def _same_queue(task: Any) -> dict[str, Any]:
    """Send the continuation to the queue this run came from (the maintenance queue)."""
    queue = (task.request.delivery_info or {}).get("routing_key")
    return {"queue": queue} if queue else {}


@app.task(name=CLEANUP_TASK, bind=True)
def cleanup_truncated_outputs(self: Any, retention_days: float | None = None) -> dict[str, Any]:
    """Delete saved outputs older than the retention, inside ``RECAP_OUTPUT_DIR`` only."""
    settings = get_settings()
    days = settings.output_retention_days if retention_days is None else retention_days
    result = cleanup_outputs(settings.output_dir, now=time.time(), retention_days=days)
    log.info("cleanup_truncated_outputs_done", retention_days=days, **result.as_dict())
    return result.as_dict()
