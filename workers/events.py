"""Compression events: one structlog line each, and the same JSON on a Redis channel when the
broker is Redis (hosts subscribe to show a "compressing..." toast).

Every text field is masked (``core.redact``) before it is logged or published: a failure's reason
can quote a provider's answer. Publishing is best effort: an event that cannot be published is
logged, never raised.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from recap.core.compression.report import COMPLETED as COMPLETED
from recap.core.compression.report import FAILED as FAILED
from recap.core.compression.report import STARTED as STARTED
from recap.core.compression.report import LogReporter, masked
from recap.core.compression.report import log as log
from recap.core.redact import known_secrets, redact
from recap.core.settings import Settings

CHANNEL = "recap:events"  # hosts SUBSCRIBE here; one JSON object per message
PUBLISH_TIMEOUT_SECONDS = 2.0  # an unreachable Redis must not hold a compression up
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def _client(url: str) -> Any:
    with _lock:
        client = _clients.get(url)
        if client is None:
            import redis

            client = _clients[url] = redis.Redis.from_url(
                url,
                socket_timeout=PUBLISH_TIMEOUT_SECONDS,
                socket_connect_timeout=PUBLISH_TIMEOUT_SECONDS,
            )
        return client


def publishes(settings: Settings) -> bool:
    """Whether events also go to Redis (the broker is Redis)."""
    return settings.broker_url.startswith(("redis://", "rediss://", "redis+socket://"))


def emit(settings: Settings, event: str, **fields: Any) -> None:
    """Log the event, then publish it on ``CHANNEL`` when the broker is Redis."""
    fields = masked(settings, fields)
    LogReporter().emit(settings, event, **fields)
    if not publishes(settings):
        return
    payload = json.dumps({"event": event, **fields}, default=str)
    try:
        _client(settings.broker_url).publish(CHANNEL, payload)
    except Exception as exc:  # best effort: the event is already in the log
        error = redact(str(exc), known_secrets(settings))
        log.warning("event_publish_failed", event_name=event, error=error)


class Publisher:
    """The workers' ``core.compression.report.Reporter``: ``emit`` (logged, and published on
    Redis when the broker is Redis)."""

    def emit(self, settings: Settings, event: str, **fields: Any) -> None:
        emit(settings, event, **fields)
