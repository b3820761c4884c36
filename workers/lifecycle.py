"""The retention task: on beat, delete conversations idle longer than
``RECAP_CONVERSATION_RETENTION_DAYS`` (unset: none is deleted), rows and files
(``core.lifecycle.expire``). A run deletes a bounded batch and, when more is left, re-enqueues
itself, so a large backlog never holds a worker for long.
"""

from __future__ import annotations

from typing import Any

import structlog

from recap.core import lifecycle
from recap.core.settings import get_settings
from recap.core.storage.db import get_engine
from recap.workers.app import task
from recap.workers.celery_types import TaskHandle

EXPIRE_TASK = "recap.expire_conversations"

log = structlog.get_logger(__name__)


@task(name=EXPIRE_TASK, bind=True)
def expire_conversations(
    self: TaskHandle[dict[str, Any]], retention_days: float | None = None
) -> dict[str, Any]:
    """Delete one batch of conversations idle past the retention; re-enqueue if more is left."""
    settings = get_settings()
    result = lifecycle.expire(
        get_engine(settings.database_url), settings, retention_days=retention_days
    )
    payload = result.as_dict()
    if result.more:
        queue = (self.request.delivery_info or {}).get("routing_key")
        options = {"queue": queue} if queue else {}
        sent = self.apply_async(kwargs={"retention_days": retention_days}, **options)
        payload["next_task_id"] = str(sent.id)
    log.info("expire_conversations_done", retention_days=retention_days, **payload)
    return payload
