"""Enqueue compression from a host app, on the right queue, without a Celery app of its own.

    from recap.workers.enqueue import compress_later

    compress_later(conversation_id)  # after each turn; never waits; returns the task id

Every sender of a compression (this helper, the CLI's ``--enqueue``, ``recap reconcile``, serve,
the demo and the benchmarks) builds one ``CompressJob`` and sends it through ``send``: the task's
name, queue and keyword arguments are written here once.

``compress_later`` reads ``RECAP_BROKER_URL`` (or takes ``broker_url``), sends the job to the
``compress`` queue with JSON (declared exactly as the workers declare it: on RabbitMQ a durable
quorum queue, and the send returns once the broker confirms it), and keeps one small Celery app
per broker URL, whose producer pool reuses the broker connection from call to call. It
configures no result backend: a host that enqueues never waits for the result, so it subscribes
to nothing (the workers still store results for Flower). A plain ``send_task`` by name also
works (the compress worker consumes Celery's default queue too); this helper is the one that
cannot get the queue wrong.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from recap.core import tracing
from recap.workers.queues import (
    COMPRESS_QUEUE,
    COMPRESS_TASK,
    ENQUEUED_HEADER,
    MEMORY_QUEUE,
    MEMORY_TASK,
)

__all__ = [
    "COMPRESS_TASK",
    "CompressJob",
    "MemoryJob",
    "compress_later",
    "producer_app",
    "reset",
    "send",
    "send_memory",
]
_apps: dict[tuple[str, str], Celery] = {}  # by URL and, for the file broker, its folder
_lock = threading.Lock()


@dataclass(frozen=True)
class CompressJob:
    """One ``recap.compress_session`` to send: checked when built, so no sender can put a bad
    argument on the queue (the task would only fail later, in a worker)."""

    conversation_id: str
    leaf: int | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.conversation_id, str) or not self.conversation_id:
            raise ValueError("conversation_id must be a non-empty string")
        leaf = self.leaf
        if leaf is not None and (isinstance(leaf, bool) or not isinstance(leaf, int)):
            raise ValueError("leaf must be a message id (an integer) or None")

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments: only what differs from the task's defaults."""
        kwargs: dict[str, Any] = {}
        if self.leaf is not None:
            kwargs["leaf_message_id"] = self.leaf
        if self.force:
            kwargs["force"] = True
        return kwargs


def send(app: Celery, job: CompressJob) -> AsyncResult[Any]:
    """Send ``job`` on ``app``'s broker to the compress queue (the one way a job is sent), in a
    PRODUCER span whose trace the task continues (W3C ``traceparent`` in its headers)."""
    return _traced_send(app, COMPRESS_TASK, COMPRESS_QUEUE, [job.conversation_id], job.kwargs())


def _traced_send(
    app: Celery, task: str, queue: str, args: list[Any], kwargs: dict[str, Any]
) -> AsyncResult[Any]:
    """``app.send_task`` in a PRODUCER span, its trace in the headers (continued by the task:
    workers.tasks, workers.memory) with the time sent (the queue lag: workers.metrics); the
    conversation is each task's first argument."""
    headers: dict[str, Any] = {ENQUEUED_HEADER: time.time()}
    attributes = {
        "messaging.system": "celery",
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "recap.conversation_id": args[0],
    }
    with tracing.span(f"send {queue}", attributes, kind=tracing.PRODUCER) as span:
        tracing.inject(headers)
        sent = app.send_task(task, args=args, kwargs=kwargs, queue=queue, headers=headers)
        span.set_attribute("messaging.message.id", str(sent.id))
    return sent


@dataclass(frozen=True)
class MemoryJob:
    """One ``recap.extract_memories`` to send: the user, the conversation and the turn."""

    user_id: str
    conversation_id: str
    leaf: int | None = None

    def __post_init__(self) -> None:
        from recap.core.values.memory import check_user

        check_user(self.user_id)
        CompressJob(self.conversation_id, self.leaf)  # the same checks of the other two

    def kwargs(self) -> dict[str, Any]:
        return {"leaf_message_id": self.leaf} if self.leaf is not None else {}


def send_memory(app: Celery, job: MemoryJob) -> AsyncResult[Any]:
    """Send ``job`` on ``app``'s broker to the memory queue, in a PRODUCER span whose trace the
    task continues (as ``send``)."""
    args = [job.conversation_id, job.user_id]  # the conversation first, as every task's
    return _traced_send(app, MEMORY_TASK, MEMORY_QUEUE, args, job.kwargs())


def compress_later(
    conversation_id: str,
    leaf: int | None = None,
    force: bool = False,
    *,
    broker_url: str | None = None,
    user_id: str | None = None,
) -> str:
    """Send one ``recap.compress_session`` to the compress queue; the task id. With
    ``user_id`` and ``RECAP_MEMORY=on``, also one ``recap.extract_memories`` of the turn to
    the memory queue (one call after each turn does both)."""
    from recap.core.settings import get_settings

    job = CompressJob(conversation_id, leaf, force)
    memory = MemoryJob(user_id, conversation_id, leaf) if user_id is not None else None
    app = producer_app(broker_url)
    task_id = str(send(app, job).id)
    if memory is not None and get_settings().memory == "on":
        send_memory(app, memory)
    return task_id


def producer_app(broker_url: str | None = None) -> Celery:
    """The cached sending app for ``broker_url`` (default: the configured broker)."""
    from recap.core.settings import get_settings

    settings = get_settings()
    url = broker_url or settings.broker_url
    # the embedded file broker's address is its folder, not its URL (always "filesystem://"):
    # a host whose RECAP_BROKER_FOLDER changes sends to the new folder, not the first one's
    folder = Path(settings.broker_folder).resolve() if url.startswith("filesystem:") else ""
    key = (url, str(folder))
    with _lock:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = _make_app(url)
        return app


def _make_app(url: str) -> Celery:
    from recap.core.settings import get_settings
    from recap.workers.app import task_queue, transport_options

    settings = get_settings().model_copy(update={"broker_url": url})
    queue = task_queue(COMPRESS_QUEUE, settings)
    memory = task_queue(MEMORY_QUEUE, settings)
    app = Celery("recap-host", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport_options=transport_options(settings),
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_queues=(queue, memory),
        task_default_exchange_type=queue.exchange.type,
        task_routes={
            COMPRESS_TASK: {"queue": COMPRESS_QUEUE},
            MEMORY_TASK: {"queue": MEMORY_QUEUE},
        },
    )
    return app


def reset() -> None:
    """Close every cached app's broker connections (tests, or a host after a fork)."""
    with _lock:
        for app in _apps.values():
            app.close()
        _apps.clear()
