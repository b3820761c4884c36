"""Compression tasks: thin wrappers over ``workers.compress`` (read, decide, call, write).

``recap.compress_session`` retries what is worth retrying through Celery, with backoff and a
bounded count; everything else ends in the JSON result. ``recap.reconcile`` re-enqueues what a
lost message or a dead worker left behind.
"""

from __future__ import annotations

from typing import Any

from celery.signals import celeryd_init, worker_process_init
from sqlalchemy import Engine

from core.db import dispose_engines, get_engine
from core.errors import RecapError
from core.settings import get_settings
from core.tokens import UnknownModelError
from workers import compress, events
from workers.app import app

COMPRESS_TASK = "recap.compress_session"
RECONCILE_TASK = "recap.reconcile"


def engine() -> Engine:
    """The process-wide engine for ``RECAP_DATABASE_URL``."""
    return get_engine(get_settings().database_url)


@celeryd_init.connect
def _load_model_client(**_: Any) -> None:
    """A worker that calls a model imports litellm while it starts (seconds), not inside its
    first compression."""
    if get_settings().summary_model:
        from workers import llm  # noqa: F401


@worker_process_init.connect
def _fresh_pool(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections."""
    dispose_engines()


@app.task(name=COMPRESS_TASK, bind=True, max_retries=None)
def compress_session(
    self: Any, conversation_id: str, leaf_message_id: int | None = None, force: bool = False
) -> dict[str, Any]:
    """Compress one conversation if it needs it; safe to enqueue many times."""
    settings = get_settings()
    try:
        return compress.compress_session(
            engine(),
            settings,
            conversation_id,
            leaf_message_id,
            force,
            attempt=self.request.retries,
            task_id=self.request.id,
            trigger="manual" if force else "enqueue",
        )
    except compress.RetryLater as exc:
        raise self.retry(countdown=exc.delay, max_retries=settings.max_attempts) from exc
    except (RecapError, UnknownModelError) as exc:
        events.log.warning(
            "compress_session_rejected", conversation_id=conversation_id, error=str(exc)
        )
        return compress.Outcome("failed", str(exc), 0, 0).as_dict()


@app.task(name=RECONCILE_TASK)
def reconcile() -> dict[str, Any]:
    """Re-enqueue conversations over their trigger whose last run is missing or died."""
    return compress.reconcile(engine(), get_settings(), enqueue)


def enqueue(conversation_id: str) -> str:
    """Send ``recap.compress_session`` for one conversation; the task id."""
    return str(app.send_task(COMPRESS_TASK, args=[conversation_id]).id)
