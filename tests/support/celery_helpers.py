"""Pointing the one Celery app at a test's own broker settings, and putting it back after.

Tests share ``workers.app.app``: each test that starts a worker configures it for its broker
with a Redis key prefix of its own (runs sharing the server never see each other's messages; on
RabbitMQ each test has a vhost of its own instead) and restores it afterwards, so no test
inherits another one's broker, connections or queues. Tests and benchmarks point the app here
and nowhere else: ``reset_app_connections`` is the one place that reaches into Celery's cached
connection pool (Celery has no public call that drops it and keeps the app registered).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from recap.core.settings import Settings, get_settings
from recap.workers.app import app, celery_config, configure, is_redis

# Celery caches the app's queue declarations, the router and default queue built on them, the
# event dispatcher (its exchange is fanout on Redis, topic on RabbitMQ) and the task sender that
# holds all of these, the first time a task is sent: without dropping them, a Redis test's
# declarations would be what a later RabbitMQ test sends with, and the other way round.
# How long an in-process worker's blocking read on Redis waits for a message (kombu: 1 s): the
# worker notices that it is asked to stop only between two reads.
REDIS_POLL_SECONDS = 0.1

_DECLARATION_CACHES = (
    "queues",
    "default_queue",
    "default_exchange",
    "router",
    "_event_dispatcher",
    "send_task_message",
)


def reset_app_connections() -> None:
    """Drop the app's cached broker connections, queue declarations and result backend, so a new
    broker URL or result backend takes effect."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    # The result backend is made once from the configuration of its first use and kept: a test
    # that read results with none configured would leave every later one a DisabledBackend.
    app._backend_cache = None  # a thread-safe backend is kept on the app, any other per thread
    app._local.__dict__.pop("backend", None)
    for name in _DECLARATION_CACHES:
        app.amqp.__dict__.pop(name, None)


@contextmanager
def configured_app(settings: Settings, prefix: str | None) -> Iterator[None]:
    """The Celery app pointed at this test's broker (with its own Redis key prefix), then
    restored."""
    saved = {key: app.conf.get(key) for key in celery_config(settings)}
    configure(app, settings)
    if prefix is not None and is_redis(settings.broker_url):
        options = {
            **app.conf.broker_transport_options,
            "global_keyprefix": prefix,
            "polling_interval": REDIS_POLL_SECONDS,
        }
        app.conf.broker_transport_options = options
    reset_app_connections()
    try:
        yield
    finally:
        app.conf.update(saved)
        reset_app_connections()


@contextmanager
def solo_worker(broker_url: str, monkeypatch: Any, **env: str) -> Iterator[None]:
    """A real worker thread (solo pool) on ``broker_url`` with results kept there, under a Redis
    key prefix of its own (other test runs share the server), consuming the app's own queues as
    deployed; ``env`` adds RECAP_* settings for it."""
    from celery.contrib.testing.worker import start_worker

    monkeypatch.setenv("RECAP_BROKER_URL", broker_url)
    monkeypatch.setenv("RECAP_RESULT_BACKEND", broker_url)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    prefix = f"recap-test-{uuid.uuid4().hex[:10]}:"
    try:
        with (
            configured_app(get_settings(), prefix),
            start_worker(app, pool="solo", perform_ping_check=False),
        ):
            yield
    finally:
        get_settings.cache_clear()


def follow_runs(first: dict[str, Any]) -> list[dict[str, Any]]:
    """The results of a task run and of every run it re-enqueued (``next_task_id``)."""
    runs = [first]
    while "next_task_id" in runs[-1]:
        runs.append(app.AsyncResult(runs[-1]["next_task_id"]).get(timeout=30))
    return runs
