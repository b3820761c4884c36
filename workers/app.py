"""The Celery app: ``celery -A workers.app worker``.

JSON only, late acks with prefetch 1, time limits from ``RECAP_TASK_TIME_LIMIT``, events on for
Flower, a ``compress`` queue (model calls: a threads pool with high concurrency) and a
``maintenance`` queue (sweeps, cleanup, reconcile: a small pool). The compress worker also consumes
Celery's default queue ``celery``, so the plainest ``send_task("recap.compress_session", ...)`` from
an app that knows nothing of Recap's routes is served too (``workers.enqueue`` routes it right).
Importing this module applies ``workers.patches`` (a worker survives a Redis restart mid-task).

The broker is Redis or RabbitMQ (``amqp://``), with the same routing on both. On RabbitMQ the
``compress`` and ``maintenance`` queues are durable quorum queues (``RECAP_AMQP_QUEUE_TYPE``,
``classic`` for servers older than 3.10) on topic exchanges, so Celery delays retries in the
broker (native delayed delivery) instead of holding them in a worker whose prefetch cannot grow
(quorum queues have no global QoS); publishes wait for the broker's confirm; and their consumers
ask for an acknowledgement timeout above what a late ack can take (``Settings.ack_timeout``). The
default queue ``celery`` stays exactly what a plain Celery app declares (classic, direct), so a
host that knows nothing of Recap can still send to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import structlog
from celery import Celery, Task
from kombu.entity import Exchange, Queue

from recap.core.redact import known_secrets, redact
from recap.core.settings import Settings, get_settings
from recap.core.storage import private
from recap.workers import filebroker, patches
from recap.workers.celery_types import (
    TaskHandle,
    celeryd_init,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
)
from recap.workers.logs import configure_logging, register_secrets
from recap.workers.queues import COMPRESS_QUEUE as COMPRESS_QUEUE
from recap.workers.queues import COMPRESS_TASK as COMPRESS_TASK
from recap.workers.queues import DEFAULT_QUEUE as DEFAULT_QUEUE
from recap.workers.queues import MAINTENANCE_QUEUE as MAINTENANCE_QUEUE
from recap.workers.queues import MEMORY_QUEUE as MEMORY_QUEUE
from recap.workers.queues import MEMORY_TASK as MEMORY_TASK

TASK_ROUTES = {
    COMPRESS_TASK: {"queue": COMPRESS_QUEUE},
    "recap.sweep_idle_tool_results": {"queue": MAINTENANCE_QUEUE},
    "recap.cleanup_truncated_outputs": {"queue": MAINTENANCE_QUEUE},
    "recap.reconcile": {"queue": MAINTENANCE_QUEUE},
    "recap.prune_compaction_log": {"queue": MAINTENANCE_QUEUE},
    "recap.recount_tokens": {"queue": MAINTENANCE_QUEUE},
    "recap.expire_conversations": {"queue": MAINTENANCE_QUEUE},
    MEMORY_TASK: {"queue": MEMORY_QUEUE},
}


# kombu ships types but leaves these constructors unannotated: calling either returns its instance
_exchange = cast(Callable[..., Exchange], Exchange)
_queue = cast(Callable[..., Queue], Queue)

AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "sentinel://")


def is_amqp(broker_url: str) -> bool:
    """Whether the broker is RabbitMQ (or another AMQP 0-9-1 server)."""
    return broker_url.startswith(AMQP_SCHEMES)


# The embedded file broker is polled (kombu's default: once a second); a listing of one folder
# ten times a second costs nothing and a task waits at most this long to be picked up.
FILE_BROKER_POLL_SECONDS = 0.1


def is_redis(url: str) -> bool:
    return url.startswith(REDIS_SCHEMES)


def quorum_queues(settings: Settings) -> bool:
    """Whether Recap's own queues are RabbitMQ quorum queues."""
    return is_amqp(settings.broker_url) and settings.amqp_queue_type == "quorum"


def transport_options(settings: Settings) -> dict[str, Any]:
    """Broker options: folders for the embedded file broker, publisher confirms for RabbitMQ, a
    visibility timeout for Redis."""
    if settings.broker_url.startswith("filesystem://"):
        folder = Path(settings.broker_folder).resolve()
        queue, control = folder / "queue", folder / "control"
        for path in (queue, control):
            private.make_folder(path)  # 0700, and .recap/ above them
        filebroker.private_messages()
        return {
            "data_folder_in": str(queue),
            "data_folder_out": str(queue),
            "control_folder": str(control),
            "polling_interval": FILE_BROKER_POLL_SECONDS,
        }
    if is_amqp(settings.broker_url):
        return {"confirm_publish": True}  # a send returns once the broker has the message
    return {"visibility_timeout": settings.visibility_timeout}


def task_queue(name: str, settings: Settings) -> Queue:
    """One of Recap's queues as the workers and ``workers.enqueue`` declare it.

    Redis and the file broker: durable, on a direct exchange of its name (as always). RabbitMQ:
    ``compress`` and ``maintenance`` are quorum queues on a topic exchange (native delayed
    delivery binds only those); ``celery`` stays Celery's own default declaration, which a plain
    ``Celery(broker=URL)`` repeats (a different one would be refused by the broker). A quorum
    queue's consumers ask for an acknowledgement timeout above ``Settings.ack_timeout`` (honoured
    from RabbitMQ 3.12, ignored before); classic queues keep the server's ``consumer_timeout``
    (see the README)."""
    if name == DEFAULT_QUEUE or not quorum_queues(settings):
        return _queue(name, _exchange(name, type="direct"), routing_key=name)
    return _queue(
        name,
        _exchange(name, type="topic"),
        routing_key=name,
        queue_arguments={"x-queue-type": "quorum"},
        consumer_arguments={"x-consumer-timeout": settings.ack_timeout * 1000},
    )


def task_queues(settings: Settings) -> tuple[Queue, ...]:
    return tuple(
        task_queue(name, settings)
        for name in (COMPRESS_QUEUE, MAINTENANCE_QUEUE, MEMORY_QUEUE, DEFAULT_QUEUE)
    )


def uses_native_delay(celery: Celery) -> bool:
    """Whether this app's countdowns go through RabbitMQ's native delayed delivery (an amqp
    broker and a quorum queue among the app's queues, as Celery itself decides)."""
    queues = celery.conf.task_queues or ()
    return is_amqp(str(celery.conf.broker_url or "")) and any(
        (queue.queue_arguments or {}).get("x-queue-type") == "quorum" for queue in queues
    )


def whole_countdown(countdown: float | None) -> float | None:
    """Native delayed delivery counts whole seconds and refuses a countdown under one (Celery
    5.7 passes ``int(countdown)`` on): round a fractional one up."""
    if countdown is None or countdown <= 0:
        return countdown
    return float(max(1, math.ceil(countdown)))


class RecapTask(Task):  # type: ignore[misc]
    """Celery's Task, with retries that native delayed delivery accepts."""

    def retry(self, *args: Any, countdown: float | None = None, **kwargs: Any) -> Any:
        if uses_native_delay(self.app):
            countdown = whole_countdown(countdown)
        return super().retry(*args, countdown=countdown, **kwargs)


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """Periodic tasks, each expiring after its interval so a backlog never piles up."""
    entries = {
        "sweep-idle-tool-results": ("recap.sweep_idle_tool_results", settings.sweep_seconds),
        "cleanup-truncated-outputs": ("recap.cleanup_truncated_outputs", settings.cleanup_seconds),
        "reconcile": ("recap.reconcile", settings.reconcile_seconds),
        "prune-compaction-log": ("recap.prune_compaction_log", settings.log_prune_seconds),
        "expire-conversations": ("recap.expire_conversations", settings.expire_seconds),
    }
    return {
        key: {"task": task, "schedule": float(every), "options": {"expires": float(every)}}
        for key, (task, every) in entries.items()
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration derived from Recap's settings."""
    options = transport_options(settings)
    backend = str(settings.result_backend or "")
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "broker_transport_options": options,
        "result_backend_transport_options": (
            {"visibility_timeout": settings.visibility_timeout} if is_redis(backend) else {}
        ),
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": settings.task_time_limit,
        "task_soft_time_limit": settings.run_seconds,
        "task_ignore_result": settings.result_backend is None,
        "result_expires": 24 * 3600,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "task_queues": task_queues(settings),
        "task_default_queue": COMPRESS_QUEUE,
        "task_default_exchange": COMPRESS_QUEUE,
        "task_default_exchange_type": task_queue(COMPRESS_QUEUE, settings).exchange.type,
        "task_default_routing_key": COMPRESS_QUEUE,
        # quorum queues have no global QoS: Celery then sets a per-consumer prefetch (5.5+)
        "worker_detect_quorum_queues": True,
        "task_routes": TASK_ROUTES,
        "beat_schedule": beat_schedule(settings),
        "timezone": "UTC",
        "enable_utc": True,
    }


def secrets_of(settings: Settings) -> list[str]:
    """Values that must never be logged: every secret the settings hold."""
    return known_secrets(settings)


def create_app(settings: Settings | None = None) -> Celery:
    """A configured Celery app with Recap's tasks registered."""
    patches.apply()
    celery = Celery("recap", task_cls=RecapTask)
    celery.conf.update(celery_config(settings or get_settings()))
    celery.conf.imports = (
        "recap.workers.tasks",
        "recap.workers.maintenance",
        "recap.workers.lifecycle",
        "recap.workers.memory",
    )
    return celery


def configure(celery: Celery, settings: Settings) -> None:
    """Re-apply settings to an existing app (tests and the CLI use this). Celery copies some
    settings into each task once, when it binds it (``task_ignore_result`` among them): Recap's
    tasks bound already take the new values too, else a process configured once without a result
    backend would store no result after it is given one."""
    config = celery_config(settings)
    celery.conf.update(config)
    if not celery.finalized:
        return  # tasks bind later, reading the configuration then in force
    for name, registered in celery.tasks.items():
        if name.startswith("recap."):
            for attribute, key in type(registered).from_config:
                if key in config:
                    setattr(type(registered), attribute, config[key])


app = create_app()
log = structlog.get_logger("recap.tasks")
_started: dict[str, float] = {}
R = TypeVar("R")


def task(**options: Any) -> Callable[[Callable[..., R]], TaskHandle[R]]:
    """``app.task(**options)``, typed: registers the function as a task of this app."""
    register: Callable[[Callable[..., R]], TaskHandle[R]] = app.task(**options)
    return register


@celeryd_init.connect  # before the worker's own start-up warnings
@setup_logging.connect
def _setup_logging(loglevel: str | None = None, **_: Any) -> None:
    """Workers log JSON through structlog; Celery's own records included."""
    settings = get_settings()
    register_secrets(secrets_of(settings))
    configure_logging(json_output=settings.log_json, level=loglevel or settings.log_level)


QUEUE_DECLARE_RETRIES = 3  # a broker still down after these is left to the consumer's own retries


@worker_init.connect
def _declare_queues(sender: Any = None, **_: Any) -> None:
    """On quorum queues, declare every Recap queue before the worker consumes: Celery's native
    delayed delivery binds each queue of the app at start, the ones this worker does not consume
    too, and a missing exchange fails the whole setup ("Native delayed delivery will not be
    available")."""
    celery = getattr(sender, "app", None) or app
    if not uses_native_delay(celery):
        return
    try:
        with celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=QUEUE_DECLARE_RETRIES)
            channel = connection.default_channel
            for queue in celery.conf.task_queues:
                queue(channel).declare()
    except Exception as exc:  # the consumer connects (and retries) on its own next
        error = redact(f"{type(exc).__name__}: {exc}", secrets_of(get_settings()))
        log.warning("queue_declare_failed", error=error)


def conversation_of(args: Any, kwargs: Any) -> str | None:
    """The conversation a task run is about, when its first argument names one."""
    if isinstance(kwargs, dict) and kwargs.get("conversation_id"):
        return str(kwargs["conversation_id"])
    if isinstance(args, list | tuple) and args and isinstance(args[0], str):
        return args[0]
    return None


@task_prerun.connect
def _bind_task(task_id: str, task: Task, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    """Every log line of a task run carries its id, its name and its conversation."""
    structlog.contextvars.clear_contextvars()
    context: dict[str, Any] = {"task_id": task_id, "task_name": task.name}
    conversation = conversation_of(args, kwargs)
    if conversation is not None:
        context["conversation_id"] = conversation
    structlog.contextvars.bind_contextvars(**context)
    _started[task_id] = time.monotonic()


@task_postrun.connect
def _task_done(task_id: str, task: Task, retval: Any = None, state: str = "", **_: Any) -> None:
    """One canonical line per task run, with its outcome and figures, then unbind."""
    started = _started.pop(task_id, None)
    figures = (
        {k: v for k, v in cast(dict[str, Any], retval).items() if isinstance(v, int | float | str)}
        if isinstance(retval, dict)
        else {}
    )
    duration = round((time.monotonic() - started) * 1000) if started is not None else None
    log.info("task_done", state=state, duration_ms=duration, **figures)
    structlog.contextvars.clear_contextvars()
