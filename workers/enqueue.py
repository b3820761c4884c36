"""Enqueue compression from a host app, on the right queue, without a Celery app of its own.

    from workers.enqueue import compress_later

    compress_later(conversation_id)  # after each turn; never waits; returns the task id

It reads ``RECAP_BROKER_URL`` (or takes ``broker_url``), sends ``recap.compress_session`` to the
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
from typing import Any

from celery import Celery

from workers.app import COMPRESS_QUEUE

COMPRESS_TASK = "recap.compress_session"
_apps: dict[str, Celery] = {}
_lock = threading.Lock()


def compress_later(
    conversation_id: str,
    leaf: int | None = None,
    force: bool = False,
    *,
    broker_url: str | None = None,
) -> str:
    """Send one ``recap.compress_session`` to the compress queue; the task id."""
    if not isinstance(conversation_id, str) or not conversation_id:
        raise ValueError("conversation_id must be a non-empty string")
    if leaf is not None and (isinstance(leaf, bool) or not isinstance(leaf, int)):
        raise ValueError("leaf must be a message id (an integer) or None")
    kwargs: dict[str, Any] = {}
    if leaf is not None:
        kwargs["leaf_message_id"] = leaf
    if force:
        kwargs["force"] = True
    app = producer_app(broker_url)
    queue = app.conf.task_queues[0]
    result = app.send_task(COMPRESS_TASK, args=[conversation_id], kwargs=kwargs, queue=queue)
    return str(result.id)


def producer_app(broker_url: str | None = None) -> Celery:
    """The cached sending app for ``broker_url`` (default: the configured broker)."""
    from core.settings import get_settings

    settings = get_settings()
    url = broker_url or settings.broker_url
    with _lock:
        app = _apps.get(url)
        if app is None:
            app = _apps[url] = _make_app(url)
        return app


def _make_app(url: str) -> Celery:
    from core.settings import get_settings
    from workers.app import task_queue, transport_options

    settings = get_settings().model_copy(update={"broker_url": url})
    queue = task_queue(COMPRESS_QUEUE, settings)
    app = Celery("recap-host", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport_options=transport_options(settings),
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_queues=(queue,),
        task_default_exchange_type=queue.exchange.type,
        task_routes={COMPRESS_TASK: {"queue": COMPRESS_QUEUE}},
    )
    return app


def reset() -> None:
    """Close every cached app's broker connections (tests, or a host after a fork)."""
    with _lock:
        for app in _apps.values():
            app.close()
        _apps.clear()
