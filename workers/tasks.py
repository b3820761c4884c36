"""Compression tasks: thin wrappers over ``workers.compress`` (read, decide, call, write).

``recap.compress_session`` retries what is worth retrying through Celery (RETRY), with backoff
and a bounded count. A run that ends ``failed`` is recorded as every run is, then the task raises
``CompressionFailed`` with the masked reason, so Celery and Flower record FAILURE; skipped, busy,
cleared and summarized runs return the contract's JSON (SUCCESS). ``recap.reconcile`` re-enqueues
what a lost message or a dead worker left behind.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sqlalchemy import Engine

from recap.core.counting.tokens import UnknownModelError
from recap.core.errors import NotFoundError, RecapError
from recap.core.redact import error_text, known_secrets, redact
from recap.core.settings import Settings, get_settings
from recap.core.storage.db import dispose_engines, get_engine, size_pool
from recap.core.values.actions import Action
from recap.workers import compress, events, metrics, tracing
from recap.workers.app import app, task
from recap.workers.celery_types import (
    TaskHandle,
    celeryd_init,
    task_received,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from recap.workers.errors import CompressionFailed, CompressionRetry
from recap.workers.queues import COMPRESS_QUEUE, COMPRESS_TASK, DEFAULT_QUEUE, RECONCILE_TASK
from recap.workers.reconcile import reconcile as reconcile_pass


def engine() -> Engine:
    """The process-wide engine for ``RECAP_DATABASE_URL``."""
    return get_engine(get_settings().database_url)


@celeryd_init.connect
def _load_model_client(options: dict[str, Any] | None = None, **_: Any) -> None:
    """A worker that calls a model imports litellm while it starts (seconds), not inside its
    first compression; a worker that consumes no compression queue never imports it (litellm
    is most of a worker's memory)."""
    if get_settings().summary_model and consumes_compressions(options or {}):
        from recap.workers import llm  # noqa: F401


@celeryd_init.connect
def _size_database_pool(options: dict[str, Any] | None = None, conf: Any = None, **_: Any) -> None:
    """Before any engine exists, size the database pool to the worker's concurrency: a thread
    holds at most one connection at a time, so that is all a worker process ever opens."""
    concurrency = (options or {}).get("concurrency") or getattr(conf, "worker_concurrency", None)
    size_pool(pool_connections((options or {}).get("pool"), concurrency))


def consumes_compressions(options: dict[str, Any]) -> bool:
    """Whether a worker started with these options consumes ``recap.compress_session`` (the
    compress queue, the default queue, or every queue when none was named)."""
    queues = options.get("queues") or []
    names = {q.strip() for q in (queues.split(",") if isinstance(queues, str) else queues)}
    return not names - {""} or bool(names & {COMPRESS_QUEUE, DEFAULT_QUEUE})


def pool_connections(pool: Any, concurrency: Any) -> int:
    """Database connections one worker process needs: one per thread of a threads (or gevent,
    eventlet) pool; one for a solo worker and for each child of a prefork pool, which runs one
    task at a time."""
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "prefork")
    if "prefork" in name or "solo" in name:
        return 1
    try:
        return max(1, int(concurrency))
    except (TypeError, ValueError):  # unset or "auto": Celery uses the CPU count
        return os.cpu_count() or 1


@worker_process_init.connect
def _fresh_pool(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections."""
    dispose_engines()
    port = get_settings().worker_metrics_port
    if port is not None:  # each prefork child serves its own metrics, after the base port
        metrics.serve(port + 1, search=True)
    tracing.configure(get_settings(), "recap-worker")  # a fork's parent's provider is kept


@celeryd_init.connect
def _trace(**_: Any) -> None:
    """With ``RECAP_TRACING``, the worker's spans go to the OTLP collector (``workers.tracing``)."""
    tracing.configure(get_settings(), "recap-worker")


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_spans(**_: Any) -> None:
    """A stopping worker (or pool child) sends the spans it still holds."""
    tracing.flush()


@celeryd_init.connect
def _serve_metrics(options: dict[str, Any] | None = None, **_: Any) -> None:
    """A threads or solo worker serves its metrics on ``RECAP_WORKER_METRICS_PORT`` (or the first
    free port after it, when another worker of the host holds it); a prefork pool's children do,
    on the ports after it."""
    port = get_settings().worker_metrics_port
    pool = (options or {}).get("pool")
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "prefork")
    if port is not None and "prefork" not in name:
        metrics.serve(port, search=True)


@task(name=COMPRESS_TASK, bind=True, max_retries=None, throws=(CompressionFailed,))
def compress_session(
    self: TaskHandle[dict[str, Any]],
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Compress one conversation if it needs it; safe to enqueue many times. A failed run ends
    the task in FAILURE (``CompressionFailed``), a retryable one in RETRY."""
    settings = get_settings()
    metrics.taken(self.request)
    with tracing.task_span(self.request, conversation_id) as span:  # the sender's trace, on
        outcome = _run(self.request, settings, conversation_id, leaf_message_id, force)
        tracing.outcome(span, outcome)
    # Raised here, outside any except block: the stored traceback chains no provider error.
    if isinstance(outcome, compress.RetryLater):
        metrics.retried()
        reason = CompressionRetry(redact(outcome.reason, known_secrets(settings)))
        raise self.retry(exc=reason, countdown=outcome.delay, max_retries=settings.max_attempts)
    if outcome["action"] == Action.FAILED:
        raise CompressionFailed(outcome["reason"])
    return outcome


def _run(
    request: Any, settings: Settings, conversation_id: str, leaf: int | None, force: bool
) -> dict[str, Any] | compress.RetryLater:
    """The run's JSON with every text masked, or the ``RetryLater`` it asked for."""
    secrets = known_secrets(settings)
    try:
        result = compress.compress_session(
            engine(),
            settings,
            conversation_id,
            leaf,
            force,
            attempt=request.retries,
            task_id=request.id,
            trigger="manual" if force else "enqueue",
        )
    except compress.RetryLater as exc:
        return exc
    except NotFoundError as exc:
        result = _unknown(settings, conversation_id, exc)
    except (RecapError, UnknownModelError) as exc:
        reason = redact(str(exc), secrets)
        events.log.warning(
            "compress_session_rejected", conversation_id=conversation_id, error=reason
        )
        result = compress.Outcome(
            action=Action.FAILED, reason=reason, tokens_before=0, tokens_after=0
        )
    except Exception as exc:  # an unexpected error still ends as one masked FAILURE
        reason = error_text(exc, secrets)
        events.log.exception("compress_session_error", conversation_id=conversation_id)
        result = compress.Outcome(
            action=Action.FAILED, reason=reason, tokens_before=0, tokens_after=0
        )
    return {k: redact(v, secrets) if isinstance(v, str) else v for k, v in result.as_dict().items()}


def _unknown(settings: Settings, conversation_id: str, exc: NotFoundError) -> compress.Outcome:
    """A queued run whose conversation is not stored (deleted since it was enqueued, by
    ``recap delete`` or the retention policy) ends as skipped, writing nothing; an unknown leaf
    of a stored conversation is still a failure."""
    from recap.core.storage.erase import conversation_exists

    reason = redact(str(exc), known_secrets(settings))
    # "unknown conversation" is said only when no row was there: deleted, and perhaps created
    # again under its id since (a new conversation, which this run never read)
    absent = str(exc).startswith("unknown conversation")
    if not absent and conversation_exists(engine(), conversation_id):
        events.log.warning(
            "compress_session_rejected", conversation_id=conversation_id, error=reason
        )
        return compress.Outcome(
            action=Action.FAILED, reason=reason, tokens_before=0, tokens_after=0
        )
    events.log.info("compress_session_unknown_conversation", conversation_id=conversation_id)
    return compress.Outcome(
        action=Action.SKIPPED,
        reason=f"{reason}: deleted, or never stored",
        tokens_before=0,
        tokens_after=0,
    )


@task_received.connect
def _json_reprs(request: Any = None, **_: Any) -> None:
    """Flower shows a compress task's arguments as JSON (the conversation id first), which is
    what its API takes to run the task again; Celery's default is Python's repr. Set on the
    worker, before its ``task-received`` event, so it holds whoever sent the task."""
    if request is None or request.name != COMPRESS_TASK:
        return
    request._argsrepr = json.dumps(list(request.args or ()))
    request._kwargsrepr = json.dumps(dict(request.kwargs or {}))


@task(name=RECONCILE_TASK)
def reconcile() -> dict[str, Any]:
    """Re-enqueue conversations over their trigger whose last run is missing or died."""
    result = reconcile_pass(engine(), get_settings(), enqueue)
    metrics.over_trigger.set(result.get("enqueued", 0))
    return result


def enqueue(conversation_id: str, *, force: bool = False) -> str:
    """Send ``recap.compress_session`` for one conversation; the task id."""
    from recap.workers.enqueue import CompressJob, send

    return str(send(app, CompressJob(conversation_id, force=force)).id)
