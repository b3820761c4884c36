"""A ``compress_session`` run in this process, as a host or the CLI needs it: retried in place
(no Celery to retry it), and for a host whose next request must fit, run again once the run
holding the conversation's lease lets go."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from sqlalchemy import Engine

from recap.core.compression.run import Parts, compress_session
from recap.core.compression.summarizer import RetryLater
from recap.core.results import CompressResult
from recap.core.settings import Settings
from recap.core.storage import lease
from recap.core.storage.models import utcnow
from recap.core.values.actions import Action

BUSY_FIRST_PAUSE = 0.05  # a host waiting for a worker's run checks the lease this soon
BUSY_MAX_PAUSE = 1.0  # and then at most this far apart


def compress_now(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
    *,
    sleep: Callable[[float], None] = time.sleep,
    parts: Parts | None = None,
) -> CompressResult:
    """``run_with_retries`` for a host that needs the next request to fit: when another run
    holds the lease, wait for it to let go (at most a lease's lifetime), then run once more."""
    again = partial(run_with_retries, engine, settings, conversation_id, leaf_message_id, force)
    result = again(parts=parts)
    if result.action != Action.BUSY:
        return result
    give_up = time.monotonic() + settings.lease_seconds
    pause = BUSY_FIRST_PAUSE
    while time.monotonic() < give_up:
        sleep(pause)
        pause = min(pause * 2, BUSY_MAX_PAUSE)
        if lease.is_free(engine, conversation_id, utcnow()):
            result = again(parts=parts)
            if result.action != Action.BUSY:
                return result
    return result


def run_with_retries(
    engine: Engine,
    settings: Settings,
    conversation_id: str,
    leaf_message_id: int | None = None,
    force: bool = False,
    *,
    sleep: Callable[[float], None] = time.sleep,
    parts: Parts | None = None,
) -> CompressResult:
    """``compress_session`` in this process, retrying in place (the CLI has no Celery to do it)."""
    for attempt in range(settings.max_attempts):
        try:
            return compress_session(
                engine,
                settings,
                conversation_id,
                leaf_message_id,
                force,
                attempt=attempt,
                trigger="manual" if force else "cli",
                parts=parts,
            )
        except RetryLater as exc:
            sleep(exc.delay)
    raise AssertionError("unreachable: the last attempt never raises RetryLater")
