"""``recap.extract_memories``: a user's memory from one turn, on the ``memory`` queue.

The run is core code (``core.memory.run``: read, call, one short write); this module gives it
the extractor of ``workers.extractors`` (the memory model through litellm, else the offline
rules) and wraps it as a task that retries what is worth retrying with
backoff (Celery's RETRY, a bounded count, as ``recap.compress_session`` does) and ends a failed
extraction in FAILURE with its masked reason (after its compaction-log row).
"""

from __future__ import annotations

import json
import time
from typing import Any

from recap.core import tracing as core_tracing
from recap.core.memory.extractor import RetryLater
from recap.core.memory.run import Failed, extract_memories
from recap.core.redact import known_secrets, redact
from recap.core.settings import get_settings
from recap.workers import events, tracing
from recap.workers.app import task
from recap.workers.celery_types import TaskHandle, task_received
from recap.workers.errors import CompressionRetry, MemoryFailed
from recap.workers.extractors import extractor_for
from recap.workers.queues import MEMORY_QUEUE, MEMORY_TASK


@task(name=MEMORY_TASK, bind=True, max_retries=None, throws=(MemoryFailed,))
def extract_memories_task(
    self: TaskHandle[dict[str, Any]],
    conversation_id: str,
    user_id: str,
    leaf_message_id: int | None = None,
) -> dict[str, Any]:
    """Extract the user's memory from the turn ending at ``leaf_message_id`` (the
    conversation first, as every Recap task takes it, so logs and Flower name it); safe to
    enqueue many times (one extraction per turn writes)."""
    from recap.workers.tasks import engine

    settings = get_settings()
    secrets = known_secrets(settings)
    started = time.monotonic()
    outcome: dict[str, Any] | RetryLater | Failed
    # the enqueuer's trace, continued (its traceparent in the message's headers)
    with tracing.task_span(self.request, conversation_id, MEMORY_QUEUE) as span:
        try:
            outcome = extract_memories(
                engine(),
                settings,
                user_id,
                conversation_id,
                leaf_message_id,
                extractors=extractor_for,
                attempt=self.request.retries,
                task_id=self.request.id,
            )
        except (RetryLater, Failed) as exc:
            outcome = exc
        if isinstance(outcome, Failed):
            core_tracing.error_status(span, "the extraction failed")
    # Raised here, outside any except block: the stored traceback chains no provider error.
    if isinstance(outcome, RetryLater):
        reason = CompressionRetry(redact(outcome.reason, secrets))
        raise self.retry(exc=reason, countdown=outcome.delay, max_retries=settings.max_attempts)
    if isinstance(outcome, Failed):
        events.log.warning("extract_memories_failed", conversation_id=conversation_id)
        raise MemoryFailed(redact(str(outcome), secrets))
    events.log.info(
        "extract_memories",
        conversation_id=conversation_id,
        action=outcome["action"],
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    return {k: redact(v, secrets) if isinstance(v, str) else v for k, v in outcome.items()}


@task_received.connect
def _json_reprs(request: Any = None, **_: Any) -> None:
    """Flower shows the task's arguments as JSON, which its API takes to run it again."""
    if request is None or request.name != MEMORY_TASK:
        return
    request._argsrepr = json.dumps(list(request.args or ()))
    request._kwargsrepr = json.dumps(dict(request.kwargs or {}))
