"""Pointing the one Celery app at a test's own broker settings, and putting it back after.

Tests share ``workers.app.app``: each test that starts a worker configures it for its broker
with a Redis key prefix of its own (runs sharing the server never see each other's messages; on
RabbitMQ each test has a vhost of its own instead) and restores it afterwards, so no test
inherits another one's broker, connections or queues. Tests and benchmarks point the app here
and nowhere else: ``reset_app_connections`` is the one place that reaches into Celery's cached
connection pool (Celery has no public call that drops it and keeps the app registered).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.settings import Settings
from workers.app import app, celery_config, configure, is_redis

# Celery caches the app's queue declarations, the router and default queue built on them, the
# event dispatcher (its exchange is fanout on Redis, topic on RabbitMQ) and the task sender that
# holds all of these, the first time a task is sent: without dropping them, a Redis test's
# declarations would be what a later RabbitMQ test sends with, and the other way round.
_DECLARATION_CACHES = (
    "queues",
    "default_queue",
    "default_exchange",
    "router",
    "_event_dispatcher",
    "send_task_message",
)


def reset_app_connections() -> None:
    """Drop the app's cached broker connections and queue declarations, so a new broker URL
    takes effect."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    for name in _DECLARATION_CACHES:
        app.amqp.__dict__.pop(name, None)


@contextmanager
def configured_app(settings: Settings, prefix: str | None) -> Iterator[None]:
    """The Celery app pointed at this test's broker (with its own Redis key prefix), then
    restored."""
    saved = {key: app.conf.get(key) for key in celery_config(settings)}
    configure(app, settings)
    if prefix is not None and is_redis(settings.broker_url):
        options = {**app.conf.broker_transport_options, "global_keyprefix": prefix}
        app.conf.broker_transport_options = options
    reset_app_connections()
    try:
        yield
    finally:
        app.conf.update(saved)
        reset_app_connections()
